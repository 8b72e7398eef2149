"""Issue 45.5: figures where people look while a reply streams: its decode speed so far (the
status bar showed the previous reply's), and a context bar (tokens the chat uses of the
model's context; the next turn computes only its new tokens)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import app.window_replies as window_replies  # noqa: E402
from core.engine.types import DoneEvent, ProgressEvent, RequestStats  # noqa: E402
from tests.app.window_fakes import WAIT_MS, ScriptedEngine, wait_ready  # noqa: E402


def test_the_speed_and_the_context_move_while_a_reply_streams(
    qtbot, open_window, tmp_path, monkeypatch
):
    monkeypatch.setattr(window_replies, "SPEED_EVERY_S", 0.0)
    engine = ScriptedEngine(tmp_path, hold=True)
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    bar = window.context_bar
    assert bar.context == 512 and bar.used == 0 and bar.label.text() == "Context 0 / 512"
    window.speed_label.setText("99.0 tok/s")  # the previous reply's
    window.composer.set_text("hello")
    window.composer.send()
    handle = engine.handles[0]
    with qtbot.waitSignal(bridge.progress, timeout=WAIT_MS):
        handle.emit(ProgressEvent(0, 40))
    assert bar.used == 40
    for piece in ("Hel", "lo", " there", "!"):
        with qtbot.waitSignal(bridge.decoded, timeout=WAIT_MS):
            handle.stream(piece)
        qtbot.wait(20)
    assert bar.used == 44 and bar.label.text() == "Context 44 / 512"
    speed = window.speed_label.text()
    assert speed.endswith(" tok/s") and speed != "99.0 tok/s"  # this reply's, live
    assert 0 < float(speed.split()[0]) < 1000
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        handle.end(
            DoneEvent(
                "Hello there!",
                RequestStats(
                    prompt_tokens=40, computed_tokens=40, completion_tokens=4, decode_tps=12.5
                ),
            )
        )
    assert window.speed_label.text() == "12.5 tok/s" and bar.used == 44
    assert "only its own tokens" in bar.toolTip()
    # another chat, then back: the bar follows the open chat
    window.new_action.trigger()
    assert bar.used == 0
    window.sessions.sessionSelected.emit(store.list_sessions()[-1].id)
    qtbot.waitUntil(lambda: bar.used == 44, timeout=WAIT_MS)


def test_each_reply_says_what_made_it_live_and_once_stored(qtbot, open_window, tmp_path):
    engine = ScriptedEngine(tmp_path, hold=True)
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    window.composer.set_text("hello")
    window.composer.send()
    stats = RequestStats(
        prompt_tokens=9, computed_tokens=9, completion_tokens=3, decode_tps=8.25, ttft_s=0.5
    )
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        engine.handles[0].end(DoneEvent("Hi!", stats))
    expected = "fake-model · temperature 0.7 · 3 tokens · 8.2 tok/s · TTFT 0.50 s"
    assert window.chat.message_widget(1).note.text() == expected
    chat = window.session.id
    window.new_action.trigger()
    window.sessions.sessionSelected.emit(chat)  # read back from the store
    qtbot.waitUntil(lambda: window.chat.message_count() == 2, timeout=WAIT_MS)
    assert window.chat.message_widget(1).note.text() == expected


def test_a_nearly_full_context_says_so(qtbot):
    from app.context_bar import ContextBar

    bar = ContextBar()
    qtbot.addWidget(bar)
    bar.set_usage(470, 512)
    assert bar.label.text() == "Context 470 / 512 · nearly full"
    assert "no longer fit" in bar.toolTip() and bar.bar.value() == 470
