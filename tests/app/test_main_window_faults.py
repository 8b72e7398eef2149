"""The window on a damaged ``chats.db`` (one bad byte): it opens, shows the damaged
message as read, says so in one row, and chats on. Part of the fault suite."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

from core.engine.types import DoneEvent, RequestStats  # noqa: E402
from tests.app.window_fakes import FakeEngine, send_turn, wait_ready  # noqa: E402
from tests.faults.conftest import fill  # noqa: E402
from tests.faults.test_damaged_chats import damaged_db  # noqa: E402

pytestmark = pytest.mark.faults


def test_the_window_opens_a_damaged_chat_and_chats_on(qtbot, open_window, tmp_path):
    """Today: the window raised 'Could not decode to UTF-8' at every start (it reopens the
    last chat, here the damaged one, the most recently updated)."""
    damaged_db(tmp_path)
    engine = FakeEngine(
        tmp_path, events=(DoneEvent("ok", RequestStats(prompt_tokens=2, computed_tokens=2)),)
    )
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    assert window.session.name == "bad"
    roles = [window.chat.message_role(i) for i in range(window.chat.message_count())]
    assert roles == ["user", "assistant", "user", "assistant", "error"]
    assert window.chat.message_text(1) == "a reply with one dam\ufffdged byte"
    assert "1 damaged message" in window.chat.message_text(4)
    send_turn(qtbot, window, bridge, "and now?")  # the damage row goes, the turn is stored
    assert [m.content for m in store.messages(window.session.id)][-2] == "and now?"


def test_the_window_shows_a_reply_it_cannot_save(qtbot, small_disk):
    """A full disk (a real 8 MB tmpfs as the data folder): the reply is shown, one line says
    it was not saved, and the chat as stored is whole."""
    from PySide6.QtCore import QSettings

    from app.bridge import EngineBridge
    from app.main_window import MainWindow
    from app.settings_dialogs import AppSettings
    from core.chats.store import ChatStore
    from core.paths import chats_db_path

    engine = FakeEngine(
        small_disk,
        events=(DoneEvent("the reply", RequestStats(prompt_tokens=2, computed_tokens=2)),),
    )
    bridge = EngineBridge(small_disk, None, engine=engine)
    store = ChatStore(chats_db_path(small_disk))
    settings = AppSettings(
        QSettings(str(small_disk.parent / "settings.ini"), QSettings.Format.IniFormat)
    )
    window = MainWindow(bridge, store, settings)
    qtbot.addWidget(window)
    try:
        window.show()
        wait_ready(qtbot, bridge)
        send_turn(qtbot, window, bridge, "first")
        fill(small_disk)  # the store is open: its log and index are there already
        send_turn(qtbot, window, bridge, "second " * 2000)
        shown = [window.chat.message_text(i) for i in range(window.chat.message_count())]
        assert shown[-1] == "the reply" and shown[-2].startswith("second")
        state = window.state_label.text()
        assert (
            state.startswith("This reply is shown but was not saved: the disk is full")
            and "\n" not in state
        )
        assert [m.content for m in store.messages(window.session.id)] == ["first", "the reply"]
    finally:
        window.close()
        bridge.shutdown()
        store.close()
