"""The window on a damaged ``chats.db`` (one bad byte): it opens, shows the damaged
message as read, says so in one row, and chats on. Part of the fault suite."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

from core.engine.types import DoneEvent, RequestStats  # noqa: E402
from tests.app.window_fakes import FakeEngine, send_turn, wait_ready  # noqa: E402
from tests.faults.test_damaged_chats import damaged_db  # noqa: E402

pytestmark = pytest.mark.faults


def test_the_window_opens_a_damaged_chat_and_chats_on(qtbot, open_window, tmp_path):
    """Today: the window raised 'Could not decode to UTF-8' at every start (it reopens the
    last chat, here the damaged one, the most recently updated)."""
    damaged_db(tmp_path)
    engine = FakeEngine(tmp_path, events=(DoneEvent("ok", RequestStats(prompt_tokens=2, computed_tokens=2)),))
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    assert window.session.name == "bad"
    roles = [window.chat.message_role(i) for i in range(window.chat.message_count())]
    assert roles == ["user", "assistant", "user", "assistant", "error"]
    assert window.chat.message_text(1) == "a reply with one dam\ufffdged byte"
    assert "1 damaged message" in window.chat.message_text(4)
    send_turn(qtbot, window, bridge, "and now?")  # the damage row goes, the turn is stored
    assert [m.content for m in store.messages(window.session.id)][-2] == "and now?"
