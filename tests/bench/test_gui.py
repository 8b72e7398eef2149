"""``radixchat bench gui`` (bench/gui.py) on a tiny model, in-process: the real window."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from bench.gui import percentile, run_bench_gui  # noqa: E402
from core.cli.main import main  # noqa: E402


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert (
        percentile(values, 50) == 50.0
        and percentile(values, 99) == 99.0
        and percentile(values, 100) == 100.0
    )
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) == 0.0


def test_bench_gui_measures_the_event_loop_over_whole_replies(qtbot, tmp_path, tiny_model, capsys):
    args = argparse.Namespace(
        data_dir=tmp_path, model=str(tiny_model), max_tokens=12, repeats=2, json=True
    )
    assert run_bench_gui(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["runs"]) == 2
    for run in report["runs"]:
        assert run["tokens"] > 0 and run["ticks"] > 0 and run["seconds"] > 0
        assert 0 <= run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
    assert report["p99_ms"] == statistics.median(r["p99_ms"] for r in report["runs"])


def test_bench_gui_prints_a_line_a_reply_and_the_median(qtbot, tmp_path, tiny_model, capsys):
    argv = ["bench", "gui", "--data-dir", str(tmp_path), "--model", str(tiny_model)]
    assert main([*argv, "--max-tokens", "8", "--repeats", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["reply 1", "reply 2", "median over 2 replies"]
    assert all(
        re.search(
            r"pieces in [\d.]+ s, \d+ ticks: lateness p50 [\d.]+ ms, p99 [\d.]+ ms, max [\d.]+ ms$",
            line,
        )
        for line in lines[:2]
    )
    assert re.fullmatch(
        r"median over 2 replies: p50 [\d.]+ ms, p99 [\d.]+ ms \(target p99 < 50 ms\)", lines[2]
    )
