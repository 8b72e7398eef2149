"""``radixchat --screenshot`` and ``radixchat bench gui`` on a tiny model, in-process."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtGui import QImage  # noqa: E402

from app.bench_gui import percentile, run_bench_gui  # noqa: E402
from app.screenshot import SIZE, run_screenshot  # noqa: E402
from core.errors import UserError  # noqa: E402
from core.models.tiny_model import TinyModelSpec, write_tiny_model  # noqa: E402


def test_the_screenshot_shows_a_three_turn_chat_and_leaves_the_data_folder_alone(
    qtbot, tmp_path, capsys
):
    model = write_tiny_model(tmp_path / "tiny", TinyModelSpec(max_position_embeddings=4096))
    data = tmp_path / "data"
    data.mkdir()
    shot = tmp_path / "docs" / "shot.png"
    assert run_screenshot(shot, data, str(model)) == 0
    assert capsys.readouterr().out.strip() == str(shot)
    image = QImage(str(shot))
    assert (image.width(), image.height()) == SIZE
    # not blank
    assert (
        len({image.pixel(x, y) for x in range(0, SIZE[0], 37) for y in range(0, SIZE[1], 29)}) > 8
    )
    assert list(data.iterdir()) == []  # a scratch folder held the chats and the cache


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert (
        percentile(values, 50) == 50.0
        and percentile(values, 99) == 99.0
        and percentile(values, 100) == 100.0
    )
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) == 0.0


def test_bench_gui_measures_the_event_loop_over_whole_replies(qtbot, tmp_path, tiny_model, capsys):
    args = argparse.Namespace(model=str(tiny_model), max_tokens=12, repeats=2, json=True)
    assert run_bench_gui(args, tmp_path) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["runs"]) == 2
    for run in report["runs"]:
        assert run["tokens"] > 0 and run["ticks"] > 0 and run["seconds"] > 0
        assert 0 <= run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
    assert report["p99_ms"] == statistics.median(r["p99_ms"] for r in report["runs"])


def test_a_failed_turn_says_why(qtbot, tmp_path, tiny_model):
    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(
        UserError,
        match="the third turn failed: the prompt is .* tokens but .* has a context of 512",
    ):
        # its 512-token context is too short
        run_screenshot(tmp_path / "shot.png", data, str(tiny_model))


def test_bench_gui_prints_a_line_a_reply_and_the_median(qtbot, tmp_path, tiny_model, capsys):
    args = argparse.Namespace(model=str(tiny_model), max_tokens=8, repeats=2, json=False)
    assert run_bench_gui(args, tmp_path) == 0
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
