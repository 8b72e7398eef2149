"""``radixchat bench speculative``'s requests and report (the servers are not started here)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from bench import speculative
from bench.speculative import Reply, format_report, speculative_report


def test_the_rewrite_prompt_holds_a_file_of_about_400_lines():
    source = speculative.source_file()
    assert 350 <= source.count("\n") <= 450
    prompt = speculative.rewrite_prompt()
    assert source in prompt and prompt.endswith(
        "```python\n" + "".join(source.splitlines(True)[:3])
    )
    compile(source, "inventory.py", "exec")  # a real module, not filler


def test_json_prompts_differ_per_request_and_parse():
    documents = [speculative.json_prompt(i) for i in range(4)]
    assert len(set(documents)) == 4
    one_line = documents[0].split("```json\n")[1].split("\n")[0]
    assert json.loads(one_line) == speculative.json_document(0)


def test_ours_asks_per_request_and_mlx_lm_gets_a_plain_body():
    path, body = speculative.request_of("chat", "off", 0, "salt", 50)
    assert path == "/v1/chat/completions"
    assert body["radixchat"] == {"speculative": "off"} and body["cache_salt"] == "salt"
    path, body = speculative.request_of("rewrite", "mlx_lm", 0, "salt", 50)
    assert path == "/v1/completions" and "radixchat" not in body and "cache_salt" not in body
    assert speculative.request_of("json", "on", 0, "s", 5)[1]["radixchat"]["speculative"] == "ngram"


def reply(tps: float, text: str = "same", drafted: int = 0, accepted: int = 0) -> Reply:
    return Reply(text, 101, 0.0, 100 / tps, drafted, accepted)


def test_report_gives_medians_ratios_acceptance_and_identity():
    runs = {
        "rewrite": {
            "mlx_lm": [[reply(10)], [reply(12)], [reply(11)]],
            "off": [[reply(10)], [reply(10)], [reply(10)]],
            "on": [[reply(25, drafted=100, accepted=60)]] * 3,
        },
        "four": {
            "mlx_lm": [[reply(10)] * 4] * 3,
            "off": [[reply(10)] * 4] * 3,
            "on": [[reply(10, text="other")] * 4] * 3,
        },
    }
    args = SimpleNamespace(model="default", repeats=3, max_tokens=100)
    report = speculative_report(args, runs)
    rewrite = report["cases"]["rewrite"]
    assert rewrite["decode_tps"]["mlx_lm"] == pytest.approx(11)
    assert rewrite["on_vs_off"] == pytest.approx(2.5)
    assert rewrite["acceptance"] == pytest.approx(0.6)
    assert rewrite["on_identical_to_off"]
    assert report["cases"]["four"]["decode_tps"]["off"] == pytest.approx(40)  # four streams at once
    assert not report["cases"]["four"]["on_identical_to_off"]
    met = {(t["case"], t["vs"]): t["met"] for t in report["targets"]}
    assert met[("rewrite", "off")] and met[("rewrite", "mlx_lm")]
    assert not met[("four", "off")]
    text = format_report(report)
    assert "rewrite" in text and "NOT met" in text
