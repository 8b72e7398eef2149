"""A reply's tool loop out of the store and back (issue 46): the JSON export carries every
call and result (images as base64), import checks them (a malformed step is one line and
writes nothing), the Markdown export shows each call and its result."""

from __future__ import annotations

import base64
import json

import pytest

from core.chats import transfer
from core.chats.store import ChatStore
from core.errors import UserError

IMAGE = base64.b64encode(bytes(range(48))).decode()
LOOK = {
    "content": "Let me look.",
    "reasoning": "A folder: list it.",
    "tool_calls": [
        {
            "id": "c1",
            "name": "list_files",
            "arguments": '{"path": "/tmp"}',
            "server": "files",
            "tool": "list_directory",
        },
        {"id": "c2", "name": "screenshot", "arguments": "{}", "server": None, "tool": None},
    ],
    "results": [
        {"id": "c1", "status": "ok", "parts": [{"type": "text", "text": "a.txt\nb.txt"}]},
        {
            "id": "c2",
            "status": "ok",
            "parts": [
                {"type": "text", "text": "the screen:"},
                {"type": "image", "mime": "image/png", "data": IMAGE},
            ],
        },
    ],
    "stats": {"prompt_tokens": 80, "cached_tokens": 0, "finish_reason": "tool_calls"},
}
REFUSED = {
    "content": "",
    "tool_calls": [
        {"id": "c3", "name": "rm", "arguments": '{"cmd": "```"}', "server": "sh", "tool": "rm"},
        {"id": "c4", "name": "cat", "arguments": "{}", "server": "sh", "tool": "cat"},
    ],
    "results": [
        {"id": "c3", "status": "denied", "parts": []},
        {"id": "c4", "status": "error", "parts": [{"type": "text", "text": "ENOENT"}]},
    ],
}


@pytest.fixture
def store(tmp_path):
    with ChatStore(tmp_path / "chats.db") as opened:
        yield opened


def _chat(store: ChatStore) -> int:
    chat = store.create_session("tools")
    store.add_turn(chat.id, "Files?", "Two files.", tool_steps=(LOOK,))
    store.replace_last_turn(chat.id, "Files?", "I could not.", tool_steps=(REFUSED,))
    return chat.id


def test_json_carries_the_tool_loops_and_they_come_back(store, tmp_path):
    chat_id = _chat(store)
    data = transfer.export_json(store, chat_id)
    reply = data["messages"][1]
    assert reply["content"] == "I could not." and reply["tool_steps"] == [REFUSED]
    assert [v.get("tool_steps") for v in reply["versions"]] == [[LOOK], [REFUSED]]
    assert IMAGE in json.dumps(data)  # the image itself, as base64
    assert "tool_steps" not in data["messages"][0]
    path = tmp_path / "chat.json"
    transfer.write_export(store, chat_id, path)
    imported = transfer.import_chat(store, transfer.read_export(path))
    (_, back) = store.messages(imported.session.id)
    assert back.tool_steps == (REFUSED,) and back.content == "I could not."
    assert [v["tool_steps"] for v in back.versions] == [(LOOK,), (REFUSED,)]
    assert transfer.export_json(store, imported.session.id)["messages"] == data["messages"]


def test_only_calls_and_results_are_imported_never_a_servers_configuration(store):
    step = {
        **LOOK,
        "server": {"command": "npx", "env": {"GITHUB_TOKEN": "ghp_secret"}},
        "tool_calls": [{**LOOK["tool_calls"][0], "headers": {"Authorization": "Bearer x"}}],
        "results": [LOOK["results"][0]],
    }
    data = {"messages": [{"role": "user", "content": "?"}, {"role": "assistant", "content": "!"}]}
    data["messages"][1]["tool_steps"] = [step]
    imported = transfer.import_chat(store, data)
    exported = json.dumps(transfer.export_json(store, imported.session.id))
    assert "ghp_secret" not in exported and "Bearer" not in exported and "npx" not in exported
    assert store.messages(imported.session.id)[1].tool_steps[0]["tool_calls"][0]["tool"] == (
        "list_directory"
    )


@pytest.mark.parametrize(
    ("steps", "said"),
    [
        ("calls", "message 2: tool steps are not a list of steps"),
        ([{"tool_calls": [{"id": "a", "name": "x"}]}], "message 2: tool step 1, call 1: its argu"),
        (
            [{**LOOK, "results": [{"id": "zz", "status": "ok", "parts": []}]}],
            "message 2: tool step 1, result 1 answers no call of its step",
        ),
        (
            [
                {
                    **LOOK,
                    "results": [
                        {"id": "c1", "status": "ok", "parts": [{"type": "image", "data": IMAGE}]}
                    ],
                }
            ],
            "an image without its MIME type",
        ),
    ],
)
def test_a_malformed_step_is_one_line_and_imports_nothing(store, steps, said):
    data = {
        "messages": [
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": "!", "tool_steps": steps},
        ]
    }
    with pytest.raises(UserError, match=said) as raised:
        transfer.import_chat(store, data)
    assert "\n" not in str(raised.value) and store.list_sessions() == []


def test_a_versions_malformed_step_is_one_line(store):
    data = {
        "messages": [
            {"role": "user", "content": "?"},
            {
                "role": "assistant",
                "content": "!",
                "versions": [{"content": "a", "tool_steps": [{}]}, {"content": "!"}],
                "version": 1,
            },
        ]
    }
    with pytest.raises(UserError, match="message 2, a version: tool step 1"):
        transfer.import_chat(store, data)
    assert store.list_sessions() == []


def test_markdown_shows_each_call_and_its_result(store):
    chat = store.create_session("md")
    store.add_turn(chat.id, "Files?", "Two files.", tool_steps=(LOOK, REFUSED))
    text = transfer.export_markdown(store, chat.id)
    assert (
        "Let me look.\n\n**Tool call:** `list_files` (files)\n\n"
        '```json\n{"path": "/tmp"}\n```\n\n**Result:**\n\n```\na.txt\nb.txt\n```\n'
    ) in text
    assert "**Tool call:** `screenshot`\n\n```json\n{}\n```\n\n" in text
    assert "```\nthe screen:\n[image]\n```" in text and IMAGE not in text
    # a fence the arguments cannot close
    assert (
        '**Tool call:** `rm` (sh)\n\n````json\n{"cmd": "```"}\n````\n\n**Result:** denied' in text
    )
    assert "**Result (error):**\n\n```\nENOENT\n```" in text
    assert text.index("**Tool call:** `cat`") < text.index("Two files.")  # the answer last
