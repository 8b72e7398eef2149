"""``radixchat bench fairness`` on a tiny generated model: the report's shape and sanity
(its timings are the benchmark's business, not a test's)."""

from __future__ import annotations

import json

from core.cli.main import EXIT_USER_ERROR, main
from core.models.tiny_model import TinyModelSpec, write_tiny_model


def test_bench_fairness_json_and_table(tmp_path, capsys):
    path = write_tiny_model(tmp_path / "tiny", TinyModelSpec(max_position_embeddings=2048))
    argv = [
        "bench",
        "fairness",
        "--model",
        str(path),
        "--long-tokens",
        "400",
        "--max-tokens",
        "8",
        "--repeats",
        "1",
        "--data-dir",
        str(tmp_path),
    ]
    assert main(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert 300 < report["long_prompt_tokens"] <= 400 and report["repeats"] == 1
    (run,) = report["runs"]
    for side in ("solo", "together"):
        figures = report[side]
        assert 0 <= figures["gap_p50_s"] <= figures["gap_p99_s"] <= figures["gap_max_s"]
        assert figures["long_ttft_s"] > 0 and run[side]["gaps"] >= 1
    assert run["solo"]["gaps"] == 7  # 8 tokens alone
    assert run["together"]["stream_ended_early"] is False  # it was still streaming when stopped
    assert report["ttft_ratio"] == report["together"]["long_ttft_s"] / report["solo"]["long_ttft_s"]
    assert report["targets"] == {"max_gap_s": 1.0, "ttft_ratio": 1.3}
    assert set(report["meets"]) == {"max_gap", "ttft_ratio"}
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "beside each other" in table and "its solo prefill (target <= 1.3x)" in table
    # over the context
    assert main(argv[:4] + ["--long-tokens", "4000"] + argv[6:]) == EXIT_USER_ERROR
    assert "does not fit" in capsys.readouterr().err
