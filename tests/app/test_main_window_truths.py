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


def test_a_reply_cut_by_quitting_is_marked_interrupted_and_plots_no_turn(
    qtbot, open_window, tmp_path
):
    """Issue 45.7: a chat quit mid-reply came back with no mark, and a 0-token turn in the
    cache panel's plot."""
    engine = ScriptedEngine(tmp_path, hold=True)
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    session_id = window.session.id
    window.composer.set_text("hello")
    window.composer.send()
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[-1].stream("Hel")
    window.close()
    open_window.close(window, bridge, store)

    window, bridge, store = open_window(engine=ScriptedEngine(tmp_path))  # the next start
    wait_ready(qtbot, bridge)
    assert window.session.id == session_id
    qtbot.waitUntil(lambda: window.chat.message_count() == 2, timeout=WAIT_MS)
    assert (
        window.chat.message_widget(1).note.text().endswith("interrupted: RadixChat quit mid-reply")
    )
    assert window.cache_panel.plotted_turns == []  # no phantom turn
    window.composer.set_text("and?")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        window.composer.send()
    assert len(window.cache_panel.plotted_turns) == 1


def test_the_chat_list_never_moves_under_the_pointer(qtbot, open_window, tmp_path):
    """Issue 45.7: a reply ending in another chat re-sorted the list under the pointer."""
    from PySide6.QtCore import QEvent, Qt
    from PySide6.QtWidgets import QApplication

    from app.session_list import ID_ROLE

    engine = ScriptedEngine(tmp_path, hold=True)
    window, bridge, _store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    first = window.session.id
    window.composer.set_text("a long story please")
    window.composer.send()
    window.new_action.trigger()  # another chat, open while the first one's reply streams
    window.composer.set_text("hi")  # give it a message: it sorts first
    window.store.add_turn(window.session.id, "hi", "hello")
    window.sessions.refresh(select_id=window.session.id)
    listing = window.sessions.list

    def order() -> list[int]:
        return [listing.item(i).data(ID_ROLE) for i in range(listing.count())]

    before = order()
    assert before[0] != first
    listing.viewport().setAttribute(Qt.WidgetAttribute.WA_UnderMouse, True)  # the pointer on it
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        engine.handles[0].end(
            DoneEvent(
                "Once.", RequestStats(prompt_tokens=4, computed_tokens=4, completion_tokens=1)
            )
        )
    assert order() == before  # the rows stay where they were
    listing.viewport().setAttribute(Qt.WidgetAttribute.WA_UnderMouse, False)
    QApplication.sendEvent(listing.viewport(), QEvent(QEvent.Type.Leave))
    assert order()[0] == first  # the pointer gone: the chat that changed moves up
