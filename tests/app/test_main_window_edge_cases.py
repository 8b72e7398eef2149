"""The main window's races and failures: acting while a reply streams or a model loads,
replies stopped early, errors, and a chat store that fails at every call. A scripted
engine lets each test release a reply's tokens and its end when it wants."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import threading  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from app.main_window import MainWindow  # noqa: E402
from core.chats.store import ChatStore  # noqa: E402
from core.engine.types import DoneEvent, ErrorEvent, RequestStats  # noqa: E402
from core.paths import chats_db_path  # noqa: E402
from tests.app.window_fakes import (  # noqa: E402
    GREEDY,
    WAIT_MS,
    FakeEngine,
    ScriptedEngine,
    make_greedy,
    send_turn,
    wait_ready,
)


def _stored(store, window) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in store.messages(window.session.id)]


def _shown(window) -> list[tuple[str, str]]:
    return [
        (window.chat.message_role(i), window.chat.message_text(i))
        for i in range(window.chat.message_count())
    ]


def _scripted(qtbot, open_window, tmp_path, hold: bool = False):
    engine = ScriptedEngine(tmp_path, hold=hold)
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    return window, bridge, store, engine


def test_regenerate_while_editing_replaces_only_the_last_turn_and_keeps_the_draft(
    qtbot, open_window, tmp_path
):
    window, bridge, store, _ = _scripted(qtbot, open_window, tmp_path)
    send_turn(qtbot, window, bridge, "one")
    send_turn(qtbot, window, bridge, "two")
    window.chat.editRequested.emit("two")
    window.composer.set_text("two, edited")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        window.regenerate_action.trigger()
    assert _stored(store, window) == [
        ("user", "one"),
        ("assistant", "reply 1"),
        ("user", "two"),
        ("assistant", "reply 3"),
    ]
    assert _shown(window) == _stored(store, window)
    assert window.composer.text() == "two, edited" and window.composer.editing  # the draft stays

    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)  # the edit still replaces one turn
    assert _stored(store, window) == [
        ("user", "one"),
        ("assistant", "reply 1"),
        ("user", "two, edited"),
        ("assistant", "reply 4"),
    ]


def test_a_reply_stopped_before_its_first_token_leaves_nothing(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path)
    send_turn(qtbot, window, bridge, "one")
    engine.replies.append(DoneEvent("", RequestStats(prompt_tokens=4, finish_reason="cancelled")))
    send_turn(qtbot, window, bridge, "two")
    assert _stored(store, window) == [("user", "one"), ("assistant", "reply 1")]  # no empty reply
    assert _shown(window) == _stored(store, window)
    assert window.composer.text() == "two"  # given back to send again
    assert len(window.cache_panel.turns) == 1
    assert "Stopped" in window.state_label.text()

    # regenerate after a cancelled reply: the previous reply stays when this one is stopped at once
    engine.replies.append(DoneEvent("", RequestStats(prompt_tokens=4, finish_reason="cancelled")))
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        window.regenerate()
    assert _stored(store, window) == [("user", "one"), ("assistant", "reply 1")]
    assert _shown(window) == _stored(store, window)
    assert window.composer.text() == "two"  # the draft is not touched by a regenerate
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        window.regenerate()
    assert _stored(store, window) == [("user", "one"), ("assistant", "reply 4")]
    assert [m.content for m in engine.requests[-1].messages] == ["one"]


def test_after_an_error_a_new_send_shows_what_is_stored(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path)
    engine.replies.append(ErrorEvent("the engine broke"))
    window.composer.set_text("hello")
    with qtbot.waitSignal(bridge.failed, timeout=WAIT_MS):
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    assert [window.chat.message_role(i) for i in range(window.chat.message_count())] == ["error"]
    send_turn(qtbot, window, bridge, "hello")
    assert _stored(store, window) == [("user", "hello"), ("assistant", "reply 2")]
    assert _shown(window) == _stored(store, window)


def test_a_failed_regenerate_keeps_the_previous_reply(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path)
    send_turn(qtbot, window, bridge, "one")
    engine.replies.append(ErrorEvent("the engine broke"))
    with qtbot.waitSignal(bridge.failed, timeout=WAIT_MS):
        window.regenerate()
    assert _stored(store, window) == [("user", "one"), ("assistant", "reply 1")]
    assert _shown(window) == _stored(store, window) + [("error", "the engine broke")]
    assert window.composer.text() == ""  # nothing to give back: "one" is still there
    assert len(window.cache_panel.turns) == 1


def test_an_edit_with_settings_out_of_range_is_sent_with_them_clamped(qtbot, open_window, tmp_path):
    """Settings written by hand out of their range (top-p 0) used to refuse the edit: they
    are clamped into it when read back (core.chats.settings.usable), the edit replaces the
    turn, nothing else is lost."""
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path)
    send_turn(qtbot, window, bridge, "one")
    send_turn(qtbot, window, bridge, "two")
    store.update_session(window.session.id, settings={"top_p": 0.0})  # written by hand, say
    window.session = store.get_session_by_id(window.session.id)
    window.chat.editRequested.emit("two")
    window.composer.set_text("deux")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    assert len(engine.requests) == 3 and engine.requests[-1].sampling.top_p == 0.01
    stored = _stored(store, window)
    assert stored[:3] == [("user", "one"), ("assistant", "reply 1"), ("user", "deux")]
    assert len(stored) == 4 and _shown(window) == stored


def test_deleting_the_open_chat_while_it_generates(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path, hold=True)
    window.composer.set_text("hello")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    doomed = window.session
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[-1].stream("Hel")
    # the list is disabled during a reply; the chat may still go (another process, say)
    store.delete_session(doomed.id)
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):  # the reply is stopped
        window.sessions.sessionDeleted.emit(doomed.id, doomed.name)
    assert engine.handles[-1].cancelled and engine.forgotten == [(doomed.name, "app")]
    # a fresh chat
    assert window.session is not None and window.session.created_at > doomed.created_at
    assert window.chat.message_count() == 0 and window.composer.send_button.isEnabled()
    assert [s.id for s in store.list_sessions()] == [window.session.id]
    assert window.sessions.current_id() == window.session.id


def test_closing_the_window_mid_reply_keeps_what_came(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path, hold=True)
    session_id = window.session.id
    window.composer.set_text("hello")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[-1].stream("Hel")
    window.close()
    assert engine.handles[-1].cancelled
    open_window.close(window, bridge, store)  # what the app does next: shutdown, close the store
    with ChatStore(chats_db_path(tmp_path)) as reopened:
        assert [(m.role, m.content) for m in reopened.messages(session_id)] == [
            ("user", "hello"),
            ("assistant", "Hel"),
        ]


def test_no_model_can_be_picked_while_the_first_one_loads(qtbot, open_window, tmp_path):
    class SlowEngine(FakeEngine):
        def __init__(self, data_root):
            super().__init__(data_root)
            self.loaded = threading.Event()

        def wait_ready(self, timeout=None):
            self.loaded.wait(timeout)
            return super().wait_ready()

    engine = SlowEngine(tmp_path)
    window, bridge, _ = open_window(engine=engine)
    assert window.model_action.isEnabled()
    bridge.start()
    assert not window.model_action.isEnabled()  # the pick would be dropped: load_model refuses
    with qtbot.waitSignal(bridge.modelReady, timeout=WAIT_MS):
        engine.loaded.set()
    assert window.model_action.isEnabled()


STORE_CALLS = (
    "list_sessions",
    "search",
    "create_session",
    "get_session_by_id",
    "messages",
    "add_turn",
    "replace_last_turn",
    "update_session",
    "rename_session",
    "delete_session",
)


@pytest.mark.parametrize("broken", STORE_CALLS)
def test_a_store_error_anywhere_gives_a_one_line_message(
    qtbot, open_window, tmp_path, monkeypatch, broken
):
    from core.errors import StoreError

    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path)
    send_turn(qtbot, window, bridge, "one")
    other = store.create_session()
    message = (
        f"{store.path} is locked by another RadixChat process; close it or use another --data-dir"
    )

    def fail(*args, **kwargs):
        raise StoreError(message)

    monkeypatch.setattr(store, broken, fail)
    shown = []

    def said() -> None:  # each action that failed said so, in one line, in the window
        text = (
            window.state_label.text()
            if "locked" in window.state_label.text()
            else window.sessions.error_label.text()
        )
        if "locked" in text:
            assert "\n" not in text
            shown.append(text)
        window.state_label.clear()
        window.sessions.error_label.clear()

    def act(action) -> None:
        action()
        if window._generating:
            qtbot.waitSignal(bridge.finished, timeout=WAIT_MS).wait()
        said()

    act(lambda: window.send("two"))
    act(window.regenerate)
    act(lambda: window._save_session_settings(dict(GREEDY), "Be brief."))
    act(window.new_chat)  # the open chat has messages: a new one is made
    act(lambda: window.sessions.sessionSelected.emit(other.id))
    act(lambda: window.sessions._on_renamed(window.session.id, "renamed"))
    window.sessions.search.setText("one")
    act(window.sessions.refresh)
    window.sessions.search.clear()
    act(window.sessions.refresh)
    window.sessions.delete(window.sessions.list.item(0).data(Qt.ItemDataRole.UserRole))
    act(lambda: window.sessions.confirm_box.button(QMessageBox.StandardButton.Yes).click())
    act(lambda: MainWindow(bridge, store, window.settings).deleteLater())  # a second window opening
    assert shown  # the broken call was made, and the user was told


def test_chat_settings_reach_the_engine_and_survive_a_restart(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path)
    window.session_settings_action.trigger()
    dialog = window.settings_dialog
    dialog.system_prompt.setPlainText("You are terse.")
    dialog.temperature.setValue(0.3)
    dialog.top_p.setValue(0.9)
    dialog.max_tokens.setValue(77)
    dialog.seed.setValue(42)
    dialog.accept()
    send_turn(qtbot, window, bridge, "one")
    request = engine.requests[-1]
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "You are terse."),
        ("user", "one"),
    ]
    sampling = request.sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens, sampling.seed) == (
        0.3,
        0.9,
        77,
        42,
    )
    session_id = window.session.id
    open_window.close(window, bridge, store)

    engine = ScriptedEngine(tmp_path)
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    assert window.session.id == session_id
    send_turn(qtbot, window, bridge, "two")
    request = engine.requests[-1]
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "user"]
    assert request.messages[0].content == "You are terse."
    sampling = request.sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens, sampling.seed) == (
        0.3,
        0.9,
        77,
        42,
    )
    window.session_settings_action.trigger()  # the dialog shows them again
    dialog = window.settings_dialog
    assert (dialog.temperature.value(), dialog.max_tokens.value(), dialog.seed.value()) == (
        0.3,
        77,
        42,
    )
    assert dialog.system_prompt.toPlainText() == "You are terse."
    dialog.reject()


def test_a_reply_stopped_at_once_on_the_real_engine_then_regenerate(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    wait_ready(qtbot, bridge)
    make_greedy(window, store)
    first, _ = send_turn(qtbot, window, bridge, "one")
    window.composer.set_text("two")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
        window.stop_action.trigger()  # before any event of the reply has arrived
    assert done.args[1].finish_reason == "cancelled"
    if done.args[0]:  # the engine got a token out first: kept, as Stop keeps it
        assert _stored(store, window)[-1] == ("assistant", done.args[0])
    else:
        assert _stored(store, window) == [("user", "one"), ("assistant", first)]
        assert window.composer.text() == "two"
    assert _shown(window) == _stored(store, window)
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as again:
        window.regenerate()
    assert again.args[1].finish_reason in ("stop", "length")
    assert _shown(window) == _stored(store, window) and _stored(store, window)[-1] == (
        "assistant",
        again.args[0],
    )


def test_preferences_open_from_the_window_with_the_default_budget(qtbot, open_window, tmp_path):
    """The window passes itself as the dialog's parent (it once landed in the budget's place)."""
    window, bridge, _ = open_window(engine=FakeEngine(tmp_path))
    wait_ready(qtbot, bridge)
    window.edit_app_settings()
    dialog = window.app_dialog
    assert dialog.parent() is window and dialog.isVisible()
    assert dialog.disk_cache_gb.specialValueText() == "Default (10 GB)"
    assert str(tmp_path) in dialog.data_dir.placeholderText()
    dialog.reject()
