"""Switching models in the window five times: the memory panel ends on what one model takes
(each switched-from model's weights stayed in memory: +1 model a switch)."""

from __future__ import annotations

import json
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


def test_a_base_model_says_so_in_the_title_and_the_chat(qtbot, open_window, tmp_path):
    """A model without a chat template is a base model: the window's title, the status bar and
    one notice above the chat say so (in every chat opened); it still replies (a fallback
    template); switching to an instruct model takes the notice away."""
    from core.models.base_models import BASE_LABEL

    base = write_tiny_model(tmp_path / "tiny-base", TinyModelSpec(seed=3))
    config = json.loads((base / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    instruct = write_tiny_model(tmp_path / "tiny-instruct", TinyModelSpec(seed=4))
    window, bridge, store = open_window(spec=str(base))
    assert wait_ready(qtbot, bridge) == "tiny-base" and bridge.model_info.base
    assert window.windowTitle() == f"New chat — tiny-base ({BASE_LABEL}) — RadixChat"
    assert window.model_label.text() == f"tiny-base ({BASE_LABEL})"
    notice = window.chat.notice_text()
    assert notice.startswith(f"tiny-base is a base model ({BASE_LABEL}): it continues text")
    make_greedy(window, store, max_tokens=4)
    reply, stats = send_turn(qtbot, window, bridge, "hello")
    assert stats.completion_tokens > 0 and window.chat.message_count() == 2
    assert window.chat.notice_text() == notice  # said once, above the chat: not per reply
    first = window.session.id
    window.new_chat()
    assert window.session.id != first and window.chat.notice_text() == notice
    window.open_session(first)
    assert window.chat.notice_text() == notice and BASE_LABEL in window.windowTitle()

    with qtbot.waitSignal(bridge.modelReady, timeout=WAIT_MS):
        window._load(str(instruct))
    assert not bridge.model_info.base and window.chat.notice_text() == ""
    assert BASE_LABEL not in window.windowTitle() and window.model_label.text() == "tiny-instruct"
