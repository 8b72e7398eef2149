"""``radixchat chats export`` and ``chats import``: a chat made with ``radixchat chat`` goes
out as Markdown and JSON (with its model and settings) and comes back in as a new chat."""

from __future__ import annotations

import json

from core import paths
from core.chats.store import ChatStore
from core.cli.main import main
from tests.core.cli.test_main import chat_json


def test_export_then_import_a_chat(capsys, tiny_model, tmp_path):
    data = tmp_path / "data"
    first = chat_json(capsys, tiny_model, data, "--session", "work", "--top-k", "20", "hello")

    assert main(["chats", "export", "work", "--data-dir", str(data)]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("# hello\n") and "## You\n\nhello\n" in markdown
    assert "## Assistant · tiny-llama, temperature 0.0, top-p 1.0, top-k 20," in markdown

    out = tmp_path / "work.json"
    assert main(["chats", "export", "work", "-o", str(out), "--data-dir", str(data)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote hello to {out} (json)"
    exported = json.loads(out.read_text())
    reply = exported["messages"][1]
    assert reply["content"] == first["reply"] and reply["model"] == "tiny-llama"
    assert reply["sampling"]["top_k"] == 20 and reply["stats"]["completion_tokens"] == 8

    elsewhere = tmp_path / "other"
    assert main(["chats", "import", str(out), "--data-dir", str(elsewhere), "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["messages"] == 2
    with ChatStore(paths.chats_db_path(elsewhere)) as store:
        session = store.get_session(made["name"])
        assert session.title == "hello"
        assert [m.content for m in store.messages(session.id)] == ["hello", first["reply"]]
    again = chat_json(capsys, tiny_model, elsewhere, "--session", made["name"], "and then?")
    assert again["computed_tokens"] > 0  # its cache is built on its first reply


def test_export_and_import_errors_are_one_line(capsys, tiny_model, tmp_path):
    data = tmp_path / "data"
    chat_json(capsys, tiny_model, data, "--session", "work", "hello")
    assert main(["chats", "export", "nope", "--data-dir", str(data)]) == 2
    assert "no chat named 'nope'" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": [{"role": "user"}]}')
    assert main(["chats", "import", str(bad), "--data-dir", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("message 1: its content is not text") and "\n" not in err
