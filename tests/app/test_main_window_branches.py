"""Issue 45.4: branches through the radix tree. Regenerate keeps the earlier replies as
versions (‹ 1/2 ›); an earlier user message is edited in a branch; "Branch" on any message
opens a new chat sharing the history, which the cache already holds: in RAM, and from disk
after a restart."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from tests.app.window_fakes import (  # noqa: E402
    WAIT_MS,
    ScriptedEngine,
    make_greedy,
    send_turn,
    wait_ready,
)


def _shown(window) -> list[tuple[str, str]]:
    return [
        (window.chat.message_role(i), window.chat.message_text(i))
        for i in range(window.chat.message_count())
    ]


def test_regenerate_keeps_versions_and_branches_keep_the_chat(qtbot, open_window, tmp_path):
    engine = ScriptedEngine(tmp_path)  # replies "reply N"
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    send_turn(qtbot, window, bridge, "one")
    send_turn(qtbot, window, bridge, "two")
    original = window.session.id
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        window.regenerate_action.trigger()
    reply = window.chat.message_widget(3)
    assert reply.text == "reply 3" and reply.version_label.text() == "2/2"
    assert reply.previous_button.isVisible() and not reply.next_button.isEnabled()
    reply.previous_button.click()  # the earlier version: the chat goes on from it
    assert _shown(window)[-1] == ("assistant", "reply 2")
    assert window.chat.message_widget(3).version_label.text() == "1/2"
    send_turn(qtbot, window, bridge, "three")
    assert [m.content for m in engine.requests[-1].messages] == [
        "one",
        "reply 1",
        "two",
        "reply 2",
        "three",
    ]

    window.chat.message_widget(1).branch_button.click()  # Branch on the first reply
    branch = window.session
    assert branch.id != original and branch.parent_id == original and branch.fork_seq == 2
    assert _shown(window) == [("user", "one"), ("assistant", "reply 1")]
    assert window.sessions.current_id() == branch.id and len(store.list_sessions()) == 2
    send_turn(qtbot, window, bridge, "another way")
    assert [m.content for m in engine.requests[-1].messages] == ["one", "reply 1", "another way"]
    assert len(store.messages(original)) == 6  # the chat it came from is whole

    window.sessions.sessionSelected.emit(original)
    first = window.chat.message_widget(0)
    qtbot.waitUntil(first.isVisible, timeout=WAIT_MS)
    assert first.fork_edit_button.isVisible()  # an earlier message: edited in a branch
    assert not window.chat.message_widget(4).fork_edit_button.isVisible()  # the last: in place
    first.fork_edit_button.click()
    assert window.session.id not in (original, branch.id) and window.chat.message_count() == 0
    assert window.composer.text() == "one"  # to edit, then send


def test_a_branch_s_history_is_a_cache_hit_in_ram_and_after_a_restart(
    qtbot, open_window, tiny_model
):
    window, bridge, store = open_window(spec=str(tiny_model))
    wait_ready(qtbot, bridge)
    make_greedy(window, store, max_tokens=8)
    send_turn(qtbot, window, bridge, "Tell me about the old harbour town and its lighthouse.")
    send_turn(qtbot, window, bridge, "And what is there to eat near the harbour?")
    window.chat.message_widget(3).branch_button.click()  # the whole history, in a branch
    branch = window.session.id
    _reply, stats = send_turn(qtbot, window, bridge, "Which boats go out in the morning?")
    shared = stats.prompt_tokens - stats.computed_tokens
    assert stats.cached_tokens > 0 and shared >= stats.prompt_tokens // 2  # the history: RAM
    assert f"{stats.cached_tokens:,} RAM" in window.cache_panel.value_text("lastTurn")
    window.sessions.sessionSelected.emit(
        next(s.id for s in store.list_sessions() if s.id != branch)
    )
    window.chat.message_widget(3).branch_button.click()  # a second branch, then a restart
    second = window.session.id
    open_window.close(window, bridge, store)

    window, bridge, store = open_window(spec=str(tiny_model))
    wait_ready(qtbot, bridge)
    assert window.session.id == second
    _reply, stats = send_turn(qtbot, window, bridge, "Is the lighthouse open at night?")
    assert stats.restored_tokens > 0  # the shared history, from the disk cache
    assert f"{stats.restored_tokens:,} disk" in window.cache_panel.value_text("lastTurn")
