"""``radixchat chats export`` and ``chats import``: a chat made with ``radixchat chat`` goes
out as Markdown and JSON (with its model and settings) and comes back in as a new chat."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from core import paths
from core.chats.store import ChatStore
from core.cli.main import main
from tests.core.cli.test_main import chat_json

ROOT = Path(__file__).parents[3]


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


# ------------------------------------------------------------------ issue 42.4
def test_ctrl_c_during_a_large_import_leaves_nothing(tmp_path):
    """SIGINT to ``radixchat chats import`` part-way through 100k messages: no chat at all
    (on main one with 27,539 of them was left)."""
    source = tmp_path / "big.json"
    filler = "x" * 300  # 35 MB of messages: SQLite spills pages to the WAL as it goes
    source.write_text(
        json.dumps(
            [
                {"role": ("user", "assistant")[i % 2], "content": f"{i} {filler}"}
                for i in range(100_000)
            ]
        )
    )
    data = tmp_path / "data"
    wal = paths.chats_db_path(data).with_name("chats.db-wal")
    process = subprocess.Popen(
        [sys.executable, "-m", "app.launcher", "chats", "import", str(source)]
        + ["--data-dir", str(data)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        if wal.exists() and wal.stat().st_size > 4 * paths.MB:  # messages being written
            break
        time.sleep(0.005)
    assert process.poll() is None, "the import ended before it could be interrupted"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130 and "imported" not in out, (out, err)
    assert "Traceback" not in err
    with ChatStore(paths.chats_db_path(data)) as store:
        assert store.list_sessions() == []
        assert store.db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0


TITLE = "\x1b]0;pwned\x07\x1b[2J"
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def test_export_to_the_terminal_escapes_control_characters(capsys, tmp_path):
    """A title or message holding terminal escapes (OSC retitle, clear screen, a C1 CSI,
    DEL) prints escaped, as Markdown and as JSON (which still reads back the
    same); written to a file with -o it is kept as it is."""
    data = tmp_path / "data"
    chat = tmp_path / "evil.json"
    content = "hi \x1b[31mred\x9b2J \x7f end"
    chat.write_text(
        json.dumps({"title": TITLE, "messages": [{"role": "user", "content": content}]})
    )
    assert main(["chats", "import", str(chat), "--data-dir", str(data), "--json"]) == 0
    name = json.loads(capsys.readouterr().out)["name"]

    assert main(["chats", "export", name, "--data-dir", str(data)]) == 0
    markdown = capsys.readouterr().out
    assert not CONTROLS.search(markdown)
    assert "# \\x1b]0;pwned\\x07\\x1b[2J" in markdown and "\\x9b2J" in markdown

    assert main(["chats", "export", name, "--format", "json", "--data-dir", str(data)]) == 0
    printed = capsys.readouterr().out
    assert not CONTROLS.search(printed)
    exported = json.loads(printed)
    assert exported["title"] == TITLE and exported["messages"][0]["content"] == content

    out = tmp_path / "kept.json"
    assert main(["chats", "export", name, "-o", str(out), "--data-dir", str(data)]) == 0
    assert not CONTROLS.search(capsys.readouterr().out)  # "wrote TITLE to ..."
    assert json.loads(out.read_text())["title"] == TITLE
