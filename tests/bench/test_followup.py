"""``radixchat bench followup``: the conversations it sends (sized in tokens, the follow-up
extending the primed prompt), its report and table, and a whole run on a tiny generated
model against mlx_lm.server."""

from __future__ import annotations

import argparse
import json

from mlx_lm.utils import load_tokenizer

from bench.agent import Reply
from bench.followup import Pair, conversation, followup_report, format_followup
from core.cli.main import main
from core.models.tiny_model import TinyModelSpec, write_tiny_model


def test_a_conversation_primes_its_prefix_and_the_follow_up_adds_the_new_tokens(tiny_model):
    tokenizer = load_tokenizer(tiny_model)

    def count(messages):
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    talk = conversation(tokenizer, 7, 400, 120)
    primed, followed = count(talk.prime), count(talk.follow_up)
    line = 100  # a line of notes, in (byte) tokens, at most
    assert 400 <= primed < 400 + line and 120 <= followed - primed < 120 + line
    assert talk.follow_up[: len(talk.prime)] == talk.prime  # it extends the primed messages
    prime_ids = tokenizer.apply_chat_template(talk.prime, add_generation_prompt=True)
    follow_ids = tokenizer.apply_chat_template(talk.follow_up, add_generation_prompt=True)
    assert follow_ids[: len(prime_ids)] == prime_ids  # so the primed prompt is its cached prefix
    assert "Trip 7" in talk.prime[0]["content"]
    other = conversation(tokenizer, 8, 400, 120)  # another conversation shares no notes' prefix
    assert other.prime[0]["content"] != talk.prime[0]["content"]


def _reply(ttft: float, cached: int) -> Reply:
    return Reply(ttft, ttft + 1, "text", 2200, cached)


def test_the_report_gives_medians_and_the_ratio_of_back_to_back_pairs():
    args = argparse.Namespace(
        model="default", prefix_tokens=[2000], new_tokens=[200], repeats=3, max_tokens=4
    )
    pairs = [
        Pair(2000, 200, _reply(a, 2002), _reply(b, 2002))
        for a, b in ((1.0, 2.0), (3.0, 2.0), (1.2, 1.0))
    ]
    report = followup_report(args, pairs, [1.0, 1.5, 2.0])
    (cell,) = report["cells"]
    assert cell["ttft_s_median"] == {"ours": 1.2, "mlx_lm": 2.0}
    assert cell["ratio_ours_vs_mlx_lm"] == 1.2  # of 0.5, 1.5 and 1.2
    assert report["cached_tokens_equal"] and cell["cached_tokens"]["ours"] == [2002] * 3
    table = format_followup(report).splitlines()
    assert table[3].split() == [
        "prefix",
        "new",
        "cached",
        "ours",
        "cached",
        "mlx_lm",
        "TTFT",
        "ours",
        "TTFT",
        "mlx_lm",
        "ours/mlx_lm",
    ]
    assert table[4].split() == ["2000", "200", "2002", "2002", "1.200s", "2.000s", "1.200x"]
    assert "cached tokens equal: True" in table[-1]


def test_bench_followup_on_a_tiny_model(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "tiny", TinyModelSpec(num_layers=2))
    argv = [
        "bench",
        "followup",
        "--model",
        str(model),
        "--prefix-tokens",
        "300",
        "--new-tokens",
        "40",
        "80",
        "--repeats",
        "1",
        "--max-tokens",
        "2",
        "--json",
        "--data-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(c["prefix_tokens"], c["new_tokens"]) for c in report["cells"]] == [
        (300, 40),
        (300, 80),
    ]
    for cell in report["cells"]:
        # both servers served the primed prompt from their caches, and computed the rest
        (cached,) = cell["cached_tokens"]["ours"]
        (prompt,) = cell["prompt_tokens"]
        assert 300 <= cached and cell["new_tokens"] <= prompt - cached
        assert all(t > 0 for t in cell["ttft_s_median"].values())
    assert report["cached_tokens_equal"] is True
    assert report["ratio_ours_vs_mlx_lm_median"] > 0 and len(report["load_1min"]) == 3
