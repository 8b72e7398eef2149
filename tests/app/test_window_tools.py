"""The tool loop in the real window (issue 46): MCP servers from mcp.json (the SDK's test
server, tests/core/mcp/servers/tools_server.py), cards that wait for Allow, results back to
the model, each step's prompt a cache hit, Stop, the step limit, first use, a failing server.

The model is the tiny random-weight one: its first step is forced (the chat's First Step:
constrained decoding makes a valid call), so the tests never depend on the model's choice.
"""

from __future__ import annotations

import json
import time

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from core.mcp.config import save_servers
from tests.app.window_fakes import WAIT_MS, make_greedy, wait_ready
from tests.core.mcp.mcp_fixtures import tools_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def open_with_tools(open_window, tmp_path, model, qtbot, servers=None, wait=("t",)):
    save_servers(tmp_path, servers if servers is not None else [tools_server()])
    window, bridge, store = open_window(spec=str(model))
    wait_ready(qtbot, bridge)
    for name in wait:
        qtbot.waitUntil(
            lambda n=name: (
                (s := window.tools.hub.status(n)) is not None and s.state in ("ready", "failed")
            ),
            timeout=WAIT_MS,
        )
    make_greedy(window, store, max_tokens=128)  # a forced call and its markup fit
    return window, bridge, store


def use_tools(window, store, server="t", tools=None, first="auto", max_steps=2):
    window.settings.mcp_acknowledged = {server}  # the first-use dialog: its own test
    assert window.tools.use_server(window.session, server, tools, True)
    window.session = store.get_session_by_id(window.session.id)
    choice = window.session.settings["tools"]
    window.tools.set_chat_tools(window.session, {**choice, "first": first, "max_steps": max_steps})
    window.session = store.get_session_by_id(window.session.id)


def ask(qtbot, window, text: str) -> None:
    window.composer.input.setPlainText(text)
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)


def waiting_card(qtbot, window):
    """The card of the call that waits for the user."""

    def found():
        message = window.chat.streaming_message()
        cards = message.cards() if message is not None else []
        return cards and cards[-1].state == "waiting" and cards[-1]

    try:
        qtbot.waitUntil(lambda: bool(found()), timeout=WAIT_MS)
    except Exception:
        count = window.chat.message_count()
        last = window.chat.message_text(count - 1) if count else ""
        raise AssertionError(
            f"no card waits; the window says {window.state_label.text()!r}, the chat {last!r}"
        ) from None
    return found()


def wait_reply_end(qtbot, window) -> None:
    qtbot.waitUntil(lambda: window._turn is None, timeout=WAIT_MS)


def last_reply(store, window):
    return store.messages(window.session.id)[-1]


def test_a_forced_call_waits_for_allow_runs_and_its_result_is_the_next_prompt(
    qtbot, open_window, tmp_path, long_tiny_model
):
    window, bridge, store = open_with_tools(open_window, tmp_path, long_tiny_model, qtbot)
    # (the tiny model's forced calls are of tools without arguments: its greedy numbers and
    # texts never end; a real model's arguments: tests/app/test_window_mcp_npm.py)
    use_tools(window, store, tools=["read_clock", "add"], first="read_clock")
    ask(qtbot, window, "What time is it?")
    card = waiting_card(qtbot, window)
    assert json.loads(card.arguments) == {}  # shown before anything runs
    assert card.arguments_view.text() == "{}" and card.allow_button.isVisible()
    assert "t › read_clock" in card.title.text()
    qtbot.mouseClick(card.allow_button, Qt.MouseButton.LeftButton)
    wait_reply_end(qtbot, window)
    assert card.state == "ok" and card.result_text == "12:00"
    reply = last_reply(store, window)
    (step,) = reply.tool_steps[:1]
    assert step["tool_calls"][0]["server"] == "t"
    assert step["tool_calls"][0]["tool"] == "read_clock"
    assert step["results"][0]["status"] == "ok"
    first, last = step["stats"], reply.stats if reply.stats else reply.tool_steps[-1]["stats"]
    # step 2's prompt is step 1's plus the call and its result: step 1's prompt from the cache
    assert last["prompt_tokens"] > first["prompt_tokens"] + len(card.result_text)
    assert last["cached_tokens"] >= first["prompt_tokens"] - 16  # whole pages of 16
    assert last["computed_tokens"] < last["prompt_tokens"] - first["prompt_tokens"] + 16
    # the chat reopens with the card, finished (no buttons)
    window.open_session(window.session.id, reload=True)
    reply_widget = window.chat.message_widget(window.chat.message_count() - 1)
    (shown,) = reply_widget.cards()[:1]
    assert shown.state == "ok" and not shown.allow_button.isVisibleTo(shown)


def test_deny_is_told_to_the_model_and_allow_for_this_chat_is_kept(
    qtbot, open_window, tmp_path, long_tiny_model
):
    window, bridge, store = open_with_tools(open_window, tmp_path, long_tiny_model, qtbot)
    use_tools(window, store, tools=["read_clock"], first="read_clock", max_steps=1)
    ask(qtbot, window, "Say hi")
    qtbot.mouseClick(waiting_card(qtbot, window).deny_button, Qt.MouseButton.LeftButton)
    wait_reply_end(qtbot, window)
    step = last_reply(store, window).tool_steps[0]
    assert step["results"][0]["status"] == "denied"
    assert (
        "limit of 1 steps"
        in window.chat.message_widget(-1 % window.chat.message_count()).note.text()
    )
    ask(qtbot, window, "Say hi again")
    qtbot.mouseClick(waiting_card(qtbot, window).allow_chat_button, Qt.MouseButton.LeftButton)
    wait_reply_end(qtbot, window)
    assert last_reply(store, window).tool_steps[0]["results"][0]["status"] == "ok"
    window.session = store.get_session_by_id(window.session.id)
    assert window.session.settings["tools"]["allowed"] == ["t/read_clock"]
    ask(qtbot, window, "Once more")  # allowed for this chat: runs without asking
    wait_reply_end(qtbot, window)
    step = last_reply(store, window).tool_steps[0]
    assert step["results"][0]["status"] == "ok"
    assert step["results"][0]["parts"][0]["text"] == "12:00"


def test_read_only_tools_run_without_asking_when_the_server_allows_it_and_images_show(
    qtbot, open_window, tmp_path, long_tiny_model
):
    server = tools_server(allow_read_only=True)
    window, bridge, store = open_with_tools(
        open_window, tmp_path, long_tiny_model, qtbot, servers=[server]
    )
    use_tools(window, store, tools=["read_clock", "picture"], first="read_clock", max_steps=1)
    ask(qtbot, window, "What time is it?")
    wait_reply_end(qtbot, window)  # no card waited: nothing clicked
    result = last_reply(store, window).tool_steps[0]["results"][0]
    assert result["status"] == "ok" and result["parts"][0]["text"] == "12:00"
    use_tools(window, store, tools=["read_clock", "picture"], first="picture", max_steps=1)
    ask(qtbot, window, "Draw")
    card = waiting_card(qtbot, window)  # not read-only: asks
    qtbot.mouseClick(card.allow_button, Qt.MouseButton.LeftButton)
    wait_reply_end(qtbot, window)
    assert card.state == "ok" and card.images and card.images[0].pixmap().width() == 2


def test_stop_cancels_the_running_call_and_ends_the_loop(
    qtbot, open_window, tmp_path, long_tiny_model
):
    window, bridge, store = open_with_tools(open_window, tmp_path, long_tiny_model, qtbot)
    use_tools(window, store, tools=["hang"], first="hang")
    ask(qtbot, window, "Wait for it")
    card = waiting_card(qtbot, window)
    qtbot.mouseClick(card.allow_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.tools.loop.state.handle is not None, timeout=WAIT_MS)
    started = time.monotonic()
    window.stop_reply()
    wait_reply_end(qtbot, window)
    assert time.monotonic() - started < 10  # not the tool's minute
    assert card.state == "cancelled"
    step = last_reply(store, window).tool_steps[0]
    assert step["results"][0]["status"] == "cancelled"
    # the server is still usable: the next call runs
    use_tools(window, store, tools=["read_clock"], first="read_clock", max_steps=1)
    choice = window.session.settings["tools"]
    window.tools.set_chat_tools(window.session, {**choice, "allowed": ["t/read_clock"]})
    window.session = store.get_session_by_id(window.session.id)
    ask(qtbot, window, "Time?")
    wait_reply_end(qtbot, window)
    assert last_reply(store, window).tool_steps[0]["results"][0]["status"] == "ok"


def test_the_first_use_of_a_server_shows_its_tools_and_waits_for_yes(
    qtbot, open_window, tmp_path, long_tiny_model, monkeypatch
):
    window, bridge, store = open_with_tools(open_window, tmp_path, long_tiny_model, qtbot)
    seen = []

    def answer(box):
        seen.append((box.text(), box.informativeText()))
        return (
            QMessageBox.StandardButton.Cancel if len(seen) == 1 else QMessageBox.StandardButton.Ok
        )

    monkeypatch.setattr(QMessageBox, "exec", answer)
    assert not window.tools.use_server(window.session, "t", None, True)
    window.session = store.get_session_by_id(window.session.id)
    assert "tools" not in window.session.settings and "t" not in window.settings.mcp_acknowledged
    assert window.tools.use_server(window.session, "t", None, True)
    assert "runs with your rights" in seen[0][0]
    assert "read_clock (read-only)" in seen[0][1] and "• add" in seen[0][1]
    assert window.settings.mcp_acknowledged == {"t"}
    window.session = store.get_session_by_id(window.session.id)
    assert window.session.settings["tools"]["servers"] == {"t": None}
    assert window.tools.use_server(window.session, "t", None, False)  # off: no question
    assert len(seen) == 2


def test_a_server_that_fails_says_so_and_the_chat_goes_on(
    qtbot, open_window, tmp_path, long_tiny_model
):
    import sys

    from core.mcp.config import McpServer

    # a server that exits at once (the SDK-level bad answers: tests/core/mcp/test_hub.py)
    bad = McpServer("bad", command=sys.executable, args=("-c", "import sys; sys.exit(3)"))
    window, bridge, store = open_with_tools(
        open_window, tmp_path, long_tiny_model, qtbot, servers=[bad], wait=("bad",)
    )
    status = window.tools.hub.status("bad")
    assert status.state == "failed" and status.error
    qtbot.waitUntil(lambda: "MCP server bad failed" in window.state_label.text(), timeout=WAIT_MS)
    window.tools.menu.aboutToShow.emit()
    titles = [a.text() for a in window.tools.menu.actions()]
    assert any(t.startswith("bad — failed") for t in titles)
    use_tools(window, store, server="bad")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        ask(qtbot, window, "Hello")  # no tools ready: a plain reply
    wait_reply_end(qtbot, window)
    assert last_reply(store, window).tool_steps == ()
