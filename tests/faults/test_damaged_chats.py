"""One bad byte in ``chats.db``: the damaged message or chat is shown as damaged with one
line saying so, everything else opens, ``radixchat chats verify`` lists what is damaged.

The damage is done as a disk or a careless tool would: bytes changed in the closed file,
where SQLite stores the value (its ``integrity_check`` still says ok)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from core import paths
from core.chats.store import ChatStore, readable
from core.cli.main import main
from tests.faults.conftest import replace_bytes

pytestmark = pytest.mark.faults


def damaged_db(root) -> dict[str, int]:
    """Two chats: "good", and "bad" whose second message holds an invalid UTF-8 byte and
    whose settings are no longer JSON (one byte each). Returns the sessions' ids."""
    path = paths.chats_db_path(root)
    with ChatStore(path) as store:
        good = store.create_session("good")
        store.add_turn(good.id, "hello", "hi there")
        bad = store.create_session("bad", settings={"marker": 12345})
        store.add_turn(
            bad.id, "first question", "a reply with one damaged byte", {"finish_reason": "stop"}
        )
        store.add_turn(bad.id, "second question", "second reply")
    replace_bytes(path, b"damaged", b"dam\xffged")  # not UTF-8
    replace_bytes(path, b"12345}", b"12345]")  # not JSON
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    return {"good": good.id, "bad": bad.id}


def test_the_store_reads_damaged_rows_as_damaged(tmp_path):
    """Today: sqlite3.OperationalError 'Could not decode to UTF-8', and a JSONDecodeError."""
    ids = damaged_db(tmp_path)
    with ChatStore(paths.chats_db_path(tmp_path)) as store:
        sessions = {s.name: s for s in store.list_sessions()}
        assert (
            sessions["bad"].damaged == "settings are not a JSON object"
            and sessions["bad"].settings == {}
        )
        assert sessions["good"].damaged is None
        messages = store.messages(ids["bad"])
        assert [m.damaged for m in messages] == [None, "content is not valid UTF-8", None, None]
        assert messages[1].content == "a reply with one dam\ufffdged byte"
        usable, line = readable(messages)
        assert usable == messages and "1 damaged message" in line and "\n" not in line
        assert [m.content for m in store.messages(ids["good"])] == ["hello", "hi there"]
        assert [s.name for s in store.search("second")] == ["bad"]
        store.add_turn(ids["bad"], "go on", "going on")  # the chat goes on
        damage = store.verify()
    assert [(d.session, d.seq, d.problem) for d in damage] == [
        ("bad", None, "settings are not a JSON object"),
        ("bad", 2, "content is not valid UTF-8"),
    ]


def test_a_message_whose_role_is_unreadable_is_left_out(tmp_path):
    ids = damaged_db(tmp_path)
    with sqlite3.connect(paths.chats_db_path(tmp_path)) as conn:
        conn.execute("PRAGMA ignore_check_constraints = 1")
        conn.execute(
            "UPDATE messages SET role = 'us\x01r' WHERE session_id = ? AND seq = 3", [ids["bad"]]
        )
    with ChatStore(paths.chats_db_path(tmp_path)) as store:
        usable, line = readable(store.messages(ids["bad"]))
    assert [m.seq for m in usable] == [1, 2, 4] and "1 left out" in line


def test_the_command_line_chat_goes_on_with_one_line_about_the_damage(tmp_path, tiny_model, capsys):
    damaged_db(tmp_path)
    code = main(
        [
            "chat",
            "--model",
            str(tiny_model),
            "--data-dir",
            str(tmp_path),
            "--temp",
            "0",
            "--max-tokens",
            "4",
            "--kv-tokens",
            "4096",
            "--json",
            "--session",
            "bad",
            "and now?",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0 and json.loads(captured.out.strip().splitlines()[-1])["saved"] is True
    said = [line for line in captured.err.splitlines() if "damaged" in line]
    assert len(said) == 1 and "Traceback" not in captured.err
    assert "1 damaged message" in said[0] and "settings are not a JSON object" in said[0]


def test_chats_verify_lists_what_is_damaged(tmp_path, capsys):
    damaged_db(tmp_path)
    assert main(["chats", "verify", "--data-dir", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "chat 'bad' (id 2), the chat's own row: settings are not a JSON object"
    assert lines[1] == "chat 'bad' (id 2), message 2: content is not valid UTF-8"
    assert lines[2].endswith("chats.db: 2 damaged")
    assert main(["chats", "verify", "--data-dir", str(tmp_path), "--json"]) == 1
    assert len(json.loads(capsys.readouterr().out)["damaged"]) == 2


def test_chats_verify_on_a_clean_store(tmp_path, capsys):
    with ChatStore(paths.chats_db_path(tmp_path)) as store:
        store.add_turn(store.create_session("fine").id, "a", "b")
    assert main(["chats", "verify", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().endswith("chats.db: clean")
