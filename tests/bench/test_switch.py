"""``radixchat bench switch`` on two tiny models: every reading, and the fresh start's."""

from __future__ import annotations

import json

from core.cli.main import main
from core.models.tiny_model import TinyModelSpec, write_tiny_model


def test_bench_switch_reads_each_load_and_a_fresh_start(capsys, tmp_path):
    first = write_tiny_model(tmp_path / "a", TinyModelSpec(seed=1))
    second = write_tiny_model(tmp_path / "b", TinyModelSpec(seed=2, hidden_size=128))
    argv = ["bench", "switch", "--models", str(first), str(second), "--switches", "3"]
    assert main([*argv, "--pool-mb", "4", "--json", "--data-dir", str(tmp_path / "d")]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    steps = [(r["step"], r["model"]) for r in report["readings"]]
    assert steps == [("start", "a"), ("switch 1", "b"), ("switch 2", "a"), ("switch 3", "b")]
    assert report["fresh"]["model"] == "b" and report["fresh"]["mlx_active_mb"] > 0
    assert all(r["rss_mb"] > 0 and r["mlx_active_mb"] > 0 for r in report["readings"])
    assert set(report["over_fresh"]) == {"rss", "mlx_active"}
