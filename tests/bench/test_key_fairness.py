"""``radixchat bench key-fairness`` on a tiny generated model: the report's shape and sanity
(its timings are the benchmark's business, not a test's)."""

from __future__ import annotations

import json

from core.cli.main import EXIT_USER_ERROR, main
from core.models.tiny_model import TinyModelSpec, write_tiny_model


def test_bench_key_fairness_json_and_table(tmp_path, capsys):
    path = write_tiny_model(tmp_path / "tiny", TinyModelSpec(max_position_embeddings=2048))
    argv = [
        "bench",
        "key-fairness",
        "--model",
        str(path),
        "--long-tokens",
        "900",
        "--queue",
        "2",
        "--queue-tokens",
        "500",
        "--repeats",
        "1",
        "--data-dir",
        str(tmp_path),
    ]
    assert main(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["repeats"] == 1 and report["queue"] == 2
    (run,) = report["runs"]
    for policy in ("shared", "before"):
        figures = report["figures"][policy]
        alone = figures["alone"]["b_ttft_s"]
        assert alone > 0 and run[policy]["alone"]["b_ttft_s"] == alone
        for scenario in ("single", "queue"):
            row = figures[scenario]
            assert row["b_ttft_s"] > 0 and row["a_total_s"] > 0
            assert row["b_ttft_vs_alone"] == row["b_ttft_s"] / alone
    shared, before = report["figures"]["shared"], report["figures"]["before"]
    for scenario in ("single", "queue"):
        ratio = shared[scenario]["a_total_s"] / before[scenario]["a_total_s"]
        assert shared[scenario]["a_total_vs_before"] == ratio
        assert set(report["meets"][scenario]) == {"b_ttft", "b_ttft_vs_alone", "a_total_vs_before"}
    assert report["targets"] == {"b_ttft_s": 2.0, "b_ttft_vs_alone": 3.0, "a_total_vs_before": 1.15}
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "1 prompt of 900 tokens" in table and "2 prompts of 500 tokens" in table
    assert "(target <= 1.15x" in table
    # over the context
    assert main(argv[:4] + ["--long-tokens", "4000"] + argv[6:]) == EXIT_USER_ERROR
    assert "do not fit" in capsys.readouterr().err
