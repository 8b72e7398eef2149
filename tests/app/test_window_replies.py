"""While a reply streams, the chat list, New chat and Chat Settings stay usable; a message sent
in another chat waits its turn, shown there, and starts when the reply ends. A scripted
engine lets each test release a reply's tokens and its end when it wants."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402

from core.engine.types import DoneEvent, RequestStats  # noqa: E402
from tests.app.window_fakes import WAIT_MS, ScriptedEngine, wait_ready  # noqa: E402


def _shown(window) -> list[tuple[str, str]]:
    return [
        (window.chat.message_role(i), window.chat.message_text(i))
        for i in range(window.chat.message_count())
    ]


def _stored(store, session_id) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in store.messages(session_id)]


def _done(text: str) -> DoneEvent:
    return DoneEvent(text, RequestStats(prompt_tokens=4, computed_tokens=4, completion_tokens=2))


def _held(qtbot, open_window, tmp_path):
    engine = ScriptedEngine(tmp_path, hold=True)
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    return window, bridge, store, engine


def _send(qtbot, window, text: str) -> None:
    window.composer.set_text(text)
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)


def test_chats_open_new_and_settings_work_while_a_reply_streams(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _held(qtbot, open_window, tmp_path)
    first = window.session.id
    _send(qtbot, window, "tell me a story")
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[0].stream("Once upon")
    assert window.sessions.isEnabled() and window.new_action.isEnabled()
    assert window.session_settings_action.isEnabled()

    window.new_action.trigger()  # a new chat while the first one streams
    second = window.session.id
    assert second != first and window.chat.message_count() == 0
    assert window.composer.send_button.isEnabled()  # this chat can send: it waits its turn
    window.session_settings_action.trigger()
    dialog = window.settings_dialog
    dialog.system_prompt.setPlainText("Be brief.")
    with qtbot.waitSignal(dialog.accepted):
        dialog.accept()
    assert store.get_session_by_id(second).system_prompt == "Be brief."
    assert store.get_session_by_id(first).system_prompt is None

    _send(qtbot, window, "and you?")
    assert len(engine.requests) == 1  # waits for the first reply
    assert _shown(window) == [("user", "and you?"), ("assistant", "")]
    assert window.state_label.text() == (
        "Waits for the reply in “tell me a story” to end (Esc takes it back)"
    )
    assert window.composer.stop_button.isEnabled() and window.composer.text() == ""

    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[0].stream(" a time")
    assert _shown(window) == [("user", "and you?"), ("assistant", "")]  # not this chat's tokens

    window.sessions.sessionSelected.emit(first)  # back to the streaming chat: it shows so far
    assert _shown(window) == [("user", "tell me a story"), ("assistant", "Once upon a time")]
    assert window.composer.stop_button.isEnabled()
    window.sessions.sessionSelected.emit(second)

    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        engine.handles[0].end(_done("Once upon a time."))
    assert _stored(store, first) == [
        ("user", "tell me a story"),
        ("assistant", "Once upon a time."),
    ]
    assert len(engine.requests) == 2  # the waiting message went at once
    request = engine.requests[1]
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief."),
        ("user", "and you?"),
    ]
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[1].stream("Fine")
    assert _shown(window) == [("user", "and you?"), ("assistant", "Fine")]
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        engine.handles[1].end(_done("Fine."))
    assert _stored(store, second) == [("user", "and you?"), ("assistant", "Fine.")]
    assert _shown(window) == _stored(store, second)
    assert window.composer.send_button.isEnabled() and window.model_action.isEnabled()


def test_a_waiting_message_can_be_taken_back(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _held(qtbot, open_window, tmp_path)
    first = window.session.id
    _send(qtbot, window, "one")
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[0].stream("x")
    window.new_action.trigger()
    second = window.session.id
    _send(qtbot, window, "waiting")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Escape)  # Esc takes it back
    assert window.chat.message_count() == 0 and window.composer.text() == "waiting"
    assert not engine.handles[0].cancelled  # the other chat's reply goes on
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        engine.handles[0].end(_done("x."))
    assert len(engine.requests) == 1 and store.messages(second) == []
    assert _stored(store, first) == [("user", "one"), ("assistant", "x.")]


def test_deleting_a_chat_drops_its_waiting_message(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _held(qtbot, open_window, tmp_path)
    _send(qtbot, window, "one")
    window.new_action.trigger()
    doomed = window.session
    _send(qtbot, window, "never sent")
    store.delete_session(doomed.id)
    window.sessions.sessionDeleted.emit(doomed.id, doomed.name)
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        engine.handles[0].end(_done("ok"))
    assert len(engine.requests) == 1  # nothing was sent for the deleted chat


def test_a_replys_thinking_shows_folded_is_stored_and_goes_back_to_the_model(
    qtbot, open_window, tmp_path
):
    from core.engine.types import ReasoningEvent

    window, bridge, store, engine = _held(qtbot, open_window, tmp_path)
    _send(qtbot, window, "2+2?")
    with qtbot.waitSignal(bridge.thinking, timeout=WAIT_MS):
        engine.handles[0].emit(ReasoningEvent("Two and two."))
    assert window.state_label.text() == "Thinking…"
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[0].stream("4")
    stats = RequestStats(
        prompt_tokens=4, computed_tokens=4, completion_tokens=7, reasoning_tokens=6
    )
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        engine.handles[0].end(DoneEvent("4", stats, reasoning="Two and two."))
    fold = window.chat.message_widget(1).thinking
    assert fold.isVisible() and fold.button.text() == "Thought for 6 tokens" and not fold.expanded
    assert _shown(window) == [("user", "2+2?"), ("assistant", "4")]  # the reply alone
    reply = store.messages(window.session.id)[1]
    assert (reply.content, reply.reasoning, reply.stats["reasoning_tokens"]) == (
        "4",
        "Two and two.",
        6,
    )
    window.sessions.sessionSelected.emit(window.session.id)  # opened again: from the store
    assert window.chat.message_widget(1).thinking.button.text() == "Thought for 6 tokens"
    _send(qtbot, window, "sure?")
    assert engine.requests[1].messages[1].reasoning == "Two and two."  # the template decides


def test_what_is_typed_while_a_reply_streams_is_kept_and_sent_once_it_ends(
    qtbot, open_window, tmp_path
):
    """Issue 45.1: the box looked editable but was read-only while a reply streamed, and 62
    characters typed then were lost."""
    window, bridge, store, engine = _held(qtbot, open_window, tmp_path)
    chat = window.session.id
    _send(qtbot, window, "tell me a story")
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[0].stream("Once upon")
    assert not window.composer.input.isReadOnly()
    qtbot.keyClicks(window.composer.input, "and one about dolphins")
    assert window.composer.text() == "and one about dolphins"
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)  # queued behind the reply
    assert len(engine.requests) == 1 and window.composer.text() == ""
    waiting = window.composer.waiting
    assert waiting.isVisibleTo(window) and "and one about dolphins" in waiting.text()
    assert _shown(window) == [("user", "tell me a story"), ("assistant", "Once upon")]
    qtbot.keyClicks(window.composer.input, "a draft")  # typed on while it waits
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[0].stream(" a time")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        engine.handles[0].end(_done("Once upon a time."))
    assert len(engine.requests) == 2  # sent once the reply was stored, after it
    assert [(m.role, m.content) for m in engine.requests[1].messages] == [
        ("user", "tell me a story"),
        ("assistant", "Once upon a time."),
        ("user", "and one about dolphins"),
    ]
    assert window.composer.text() == "a draft" and not waiting.isVisibleTo(window)
    assert _shown(window)[-2:] == [("user", "and one about dolphins"), ("assistant", "")]
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        engine.handles[1].end(_done("Dolphins."))
    assert _stored(store, chat)[-2:] == [
        ("user", "and one about dolphins"),
        ("assistant", "Dolphins."),
    ]


def test_esc_takes_back_the_message_queued_behind_its_chats_reply_then_stops_the_reply(
    qtbot, open_window, tmp_path
):
    window, bridge, store, engine = _held(qtbot, open_window, tmp_path)
    _send(qtbot, window, "one")
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[0].stream("x")
    _send(qtbot, window, "second")
    _send(qtbot, window, "ignored while one waits")  # one waits per chat: the box keeps it
    assert window.composer.text() == "ignored while one waits"
    assert "already waits" in window.state_label.text()
    window.composer.set_text("third")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Escape)  # takes the waiting one back
    assert window.composer.text() == "second\nthird" and not engine.handles[0].cancelled
    assert not window.composer.waiting.isVisibleTo(window)
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Escape)  # now stops the reply
    assert engine.handles[0].cancelled
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        engine.handles[0].end(_done("x"))
    assert len(engine.requests) == 1 and window.composer.text() == "second\nthird"
