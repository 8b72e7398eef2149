"""Issue 45.7: the small lies the window told, each fixed: status messages that stayed for
minutes, ..."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import app.main_window as main_window  # noqa: E402
from core.engine.types import DoneEvent, RequestStats  # noqa: E402
from tests.app.window_fakes import WAIT_MS, ScriptedEngine, wait_ready  # noqa: E402


def test_a_status_message_times_out_and_the_status_says_what_goes_on(
    qtbot, open_window, tmp_path, monkeypatch
):
    monkeypatch.setattr(main_window, "STATUS_TIMEOUT_MS", 100)
    engine = ScriptedEngine(tmp_path, hold=True)
    window, bridge, _store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    label = window.state_label
    window._set_state_text("Could not save the settings: disk I/O error")
    qtbot.waitUntil(lambda: label.text() == "Ready", timeout=WAIT_MS)
    window.composer.set_text("hello")
    window.composer.send()
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[0].stream("Hi")
    assert label.text() == "Generating…"
    qtbot.wait(300)
    assert label.text() == "Generating…"  # what goes on stays
    window._set_state_text("Chat settings saved: they apply from the next reply")
    qtbot.waitUntil(lambda: label.text() == "Generating…", timeout=WAIT_MS)  # back to it
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        engine.handles[0].end(
            DoneEvent("Hi.", RequestStats(prompt_tokens=4, computed_tokens=4, completion_tokens=1))
        )
    qtbot.waitUntil(lambda: label.text() == "Ready", timeout=WAIT_MS)
