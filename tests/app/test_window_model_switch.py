"""Switching models in the window five times: the memory panel ends on what one model takes
(each switched-from model's weights stayed in memory: +1 model a switch)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from core.models.tiny_model import TinyModelSpec, write_tiny_model  # noqa: E402
from tests.app.window_fakes import WAIT_MS, make_greedy, send_turn, wait_ready  # noqa: E402

WIDE = {"hidden_size": 512, "intermediate_size": 2048, "num_layers": 4, "num_heads": 8}


def _mlx_active(qtbot, window, bridge) -> tuple[int, str]:
    with qtbot.waitSignal(bridge.statsUpdated, timeout=WAIT_MS) as polled:
        bridge.poll_stats()
    return polled.args[0].mlx_active_bytes, window.memory_panel.value_text("mlxActive")


def test_five_switches_in_the_window_hold_one_model(qtbot, open_window, tmp_path):
    first = write_tiny_model(tmp_path / "first", TinyModelSpec(**WIDE, seed=1))
    second = write_tiny_model(tmp_path / "second", TinyModelSpec(**WIDE, seed=2))
    window, bridge, store = open_window(spec=str(first))
    wait_ready(qtbot, bridge)
    make_greedy(window, store, max_tokens=4)
    send_turn(qtbot, window, bridge, "hello")
    one_model, _ = _mlx_active(qtbot, window, bridge)
    weights = bridge.model_info.weight_bytes
    for spec in (second, first, second, first, second):
        with qtbot.waitSignal(bridge.modelReady, timeout=WAIT_MS) as ready:
            window._load(str(spec))
        assert ready.args == [spec.name] and window.model_label.text() == spec.name
        send_turn(qtbot, window, bridge, "hello")
    after, shown = _mlx_active(qtbot, window, bridge)
    assert abs(after - one_model) < weights / 10  # the old weights went each time
    assert shown == window.memory_panel.value_text("mlxActive") and shown.endswith("MB")
