"""File › Export Chat… and Import Chat… on the real engine: a chat goes out as Markdown and
JSON (with its model and settings), comes back in as a new chat, and goes on from there."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app.chat_files import JSON_FILTER, MARKDOWN_FILTER  # noqa: E402
from tests.app.window_fakes import make_greedy, send_turn, wait_ready  # noqa: E402


def test_a_chat_goes_out_and_comes_back_in(qtbot, open_window, tiny_model, tmp_path):
    window, bridge, store = open_window(spec=str(tiny_model))
    name = wait_ready(qtbot, bridge)
    make_greedy(window, store, max_tokens=8, repetition_penalty=1.1)
    first, _ = send_turn(qtbot, window, bridge, "Hello there")
    original = window.session.id

    files = window.chat_files
    files._ask_export_path = lambda stem: (str(tmp_path / stem), MARKDOWN_FILTER)
    window.chat_files.export_action.trigger()
    markdown = (tmp_path / "Hello there.md").read_text()
    assert markdown.startswith("# Hello there\n") and "## You\n\nHello there\n" in markdown
    assert f"## Assistant · {name}, temperature 0.0," in markdown
    assert "repetition penalty 1.1" in markdown
    assert "Exported “Hello there”" in window.state_label.text()

    files._ask_export_path = lambda stem: (str(tmp_path / "out"), JSON_FILTER)
    window.chat_files.export_action.trigger()
    data = json.loads((tmp_path / "out.json").read_text())
    reply = data["messages"][1]
    assert reply["content"] == first and reply["model"] == name
    assert reply["sampling"]["max_tokens"] == 8 and reply["stats"]["completion_tokens"] > 0

    files._ask_import_path = lambda: str(tmp_path / "out.json")
    with qtbot.waitSignal(files.imported) as imported:
        window.chat_files.import_action.trigger()
    assert window.session.id == imported.args[0] != original
    assert window.sessions.current_id() == window.session.id
    assert [window.chat.message_text(i) for i in range(window.chat.message_count())] == [
        "Hello there",
        first,
    ]
    assert "Imported “Hello there”: 2 messages" in window.state_label.text()
    assert window.session.settings["repetition_penalty"] == 1.1
    again, stats = send_turn(qtbot, window, bridge, "And then?")  # it goes on from there
    assert stats.prompt_tokens > 0 and len(store.messages(window.session.id)) == 4

    (tmp_path / "bad.json").write_text('{"messages": [{"role": "wizard", "content": "x"}]}')
    files._ask_import_path = lambda: str(tmp_path / "bad.json")
    sessions = len(store.list_sessions())
    window.chat_files.import_action.trigger()
    assert window.state_label.text().startswith("Could not import bad.json: message 1: role")
    assert len(store.list_sessions()) == sessions
