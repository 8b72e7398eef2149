"""A reply's tool loop in the chat store (issue 46): stored beside its answer, kept by its
versions and branches, read back from an older database, and damage said, never raised."""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

from core.chats.store import SCHEMA_VERSION, ChatStore, readable
from core.chats.tool_steps import StepError
from core.chats.turn import ChatTurn
from core.engine.types import RequestStats
from core.errors import StoreError

STEP = {
    "content": "Let me look.",
    "tool_calls": [
        {
            "id": "c1",
            "name": "files__list",
            "arguments": '{"path": "/tmp"}',
            "server": "files",
            "tool": "list",
        }
    ],
    "results": [{"id": "c1", "status": "ok", "parts": [{"type": "text", "text": "a.txt"}]}],
    "stats": {"prompt_tokens": 30, "cached_tokens": 0, "finish_reason": "tool_calls"},
}
DENIED_STEP = {
    "content": "",
    "tool_calls": [{"id": "c2", "name": "rm", "arguments": "{}", "server": "files", "tool": "rm"}],
    "results": [{"id": "c2", "status": "denied", "parts": []}],
}


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "chats.db"


@pytest.fixture
def store(db_path):
    with ChatStore(db_path) as store:
        yield store


def test_a_reply_keeps_its_tool_loop_and_a_plain_one_has_none(store, db_path):
    chat = store.create_session("tools")
    user, reply = store.add_turn(chat.id, "Files?", "One: a.txt.", {"x": 1}, tool_steps=(STEP,))
    assert reply.tool_steps == (STEP,) and reply.content == "One: a.txt." and not reply.damaged
    assert user.tool_steps == ()
    _, plain = store.add_turn(chat.id, "hi", "hello")
    assert plain.tool_steps == ()
    note = store.add_message(chat.id, "assistant", "noted", tool_steps=[DENIED_STEP])
    assert note.tool_steps == (DENIED_STEP,)
    assert [m.tool_steps for m in store.messages(chat.id)] == [(), (STEP,), (), (), (DENIED_STEP,)]
    conn = sqlite3.connect(db_path)  # a plain reply's column is NULL
    assert conn.execute("SELECT count(*) FROM messages WHERE tool_steps IS NULL").fetchone() == (3,)
    conn.close()


def test_steps_that_are_not_steps_write_nothing(store):
    chat = store.create_session("tools")
    store.add_turn(chat.id, "one", "1")
    with pytest.raises(StepError, match="tool step 1"):
        store.add_turn(chat.id, "two", "2", tool_steps=[{"tool_calls": []}])
    with pytest.raises(StepError):
        store.replace_last_turn(chat.id, "one", "1 again", tool_steps=[7])
    bad_text = {**STEP, "content": "\ud800"}
    with pytest.raises(StoreError, match="UTF-8"):
        store.add_turn(chat.id, "two", "2", tool_steps=[bad_text])
    assert [m.content for m in store.messages(chat.id)] == ["one", "1"]


def test_regenerated_versions_keep_their_steps_and_choosing_one_brings_them_back(store):
    chat = store.create_session("tools")
    store.add_turn(chat.id, "Files?", "With a tool.", tool_steps=(STEP,))
    _, second = store.replace_last_turn(chat.id, "Files?", "Without.")
    assert second.tool_steps == () and second.version == 1
    assert [v["tool_steps"] for v in second.versions] == [(STEP,), ()]
    _, third = store.replace_last_turn(chat.id, "Files?", "Denied.", tool_steps=(DENIED_STEP,))
    assert [v["tool_steps"] for v in third.versions] == [(STEP,), (), (DENIED_STEP,)]
    first = store.select_version(third.id, 0)
    assert (first.content, first.tool_steps) == ("With a tool.", (STEP,))
    plain = store.select_version(third.id, 1)
    assert (plain.content, plain.tool_steps) == ("Without.", ())
    assert store.messages(chat.id)[-1].tool_steps == ()


def test_a_branch_copies_the_tool_loops_it_takes(store):
    chat = store.create_session("tools")
    store.add_turn(chat.id, "Files?", "One.", tool_steps=(STEP,))
    store.add_turn(chat.id, "More?", "No.")
    branch = store.branch_session(chat.id, 2)
    assert [m.tool_steps for m in store.messages(branch.id)] == [(), (STEP,)]


def test_import_takes_steps_as_the_sixth_of_a_message(store):
    session = store.import_session(
        [("user", "Files?", None, None), ("assistant", "One.", None, None, None, (STEP,))]
    )
    assert [m.tool_steps for m in store.messages(session.id)] == [(), (STEP,)]
    with pytest.raises(StepError):
        store.import_session([("assistant", "x", None, None, None, [{"tool_calls": 5}])])
    assert len(store.list_sessions()) == 1  # nothing of the bad chat


def test_a_chat_of_the_third_schema_gains_tool_steps_losing_nothing(db_path):
    with ChatStore(db_path) as store:
        chat = store.create_session("old")
        store.add_turn(chat.id, "hi", "one", {"completion_tokens": 1}, reasoning="hmm")
        store.replace_last_turn(chat.id, "hi", "two")
    conn = sqlite3.connect(db_path)  # back to the schema of before: what an old chats.db is
    conn.executescript("ALTER TABLE messages DROP COLUMN tool_steps; PRAGMA user_version = 3;")
    conn.close()
    with ChatStore(db_path) as store:
        messages = store.messages(store.get_session("old").id)
        assert [(m.content, m.reasoning, m.tool_steps, m.damaged) for m in messages] == [
            ("hi", None, (), None),
            ("two", None, (), None),
        ]
        assert [v["content"] for v in messages[1].versions] == ["one", "two"]
        assert messages[1].versions[0]["tool_steps"] == ()
        store.add_turn(messages[0].session_id, "files?", "a.txt", tool_steps=(STEP,))
        assert store.messages(messages[0].session_id)[-1].tool_steps == (STEP,)
        assert store.verify() == []
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    conn.close()


@pytest.mark.parametrize(
    ("stored", "says"),
    [
        ("{not json", "its tool steps do not read back (tool steps are not JSON)"),
        ('{"content": "x"}', "tool steps are not a list of steps"),
        ('[{"tool_calls": [{"id": "a"}]}]', "tool step 1, call 1: its name is not text"),
        (b"[\xff]", "tool_steps is not valid UTF-8"),
    ],
)
def test_damaged_tool_steps_are_reported_and_the_answer_still_reads(store, db_path, stored, says):
    chat = store.create_session("tools")
    store.add_turn(chat.id, "Files?", "One: a.txt.", tool_steps=(STEP,))
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE messages SET tool_steps = ? WHERE role = 'assistant'", [stored])
    conn.commit()
    conn.close()
    reply = store.messages(chat.id)[1]
    assert reply.content == "One: a.txt." and reply.tool_steps == () and says in reply.damaged
    usable, line = readable(store.messages(chat.id))
    assert len(usable) == 2 and "1 damaged message" in line  # the chat goes on from it
    (damage,) = store.verify()
    assert damage.seq == 2 and says in str(damage)
    turn = ChatTurn.start(store, store.get_session_by_id(chat.id), "And?")
    assert [m.role for m in turn.messages] == ["user", "assistant", "user"]


def test_a_versions_damaged_steps_are_reported(store, db_path):
    chat = store.create_session("tools")
    store.add_turn(chat.id, "Files?", "one", tool_steps=(STEP,))
    store.replace_last_turn(chat.id, "Files?", "two")
    conn = sqlite3.connect(db_path)
    conn.execute(
        """UPDATE messages SET versions = '{"chosen": 1, "replies": [{"content": "one",
           "tool_steps": "x"}, {"content": "two"}]}' WHERE role = 'assistant'"""
    )
    conn.commit()
    conn.close()
    reply = store.messages(chat.id)[1]
    assert [v["tool_steps"] for v in reply.versions] == [(), ()]
    assert "the tool steps of its version 1 do not read back" in reply.damaged


# -- a turn saves its tool loop --

DONE = RequestStats(prompt_tokens=50, cached_tokens=30, computed_tokens=20, completion_tokens=4)


def test_a_turn_stores_its_tool_loop_and_a_regenerated_one_replaces_it(store):
    chat = store.create_session("tools")
    turn = ChatTurn.start(store, chat, "Files?")
    assert turn.save(store, "One: a.txt.", DONE, tool_steps=(STEP,)).stored
    reply = store.messages(chat.id)[-1]
    assert reply.tool_steps == (STEP,) and reply.stats == dataclasses.asdict(DONE)
    again = ChatTurn.start(store, chat, "Files?", replace=True)
    assert again.finish(store, "Denied.", DONE, tool_steps=(DENIED_STEP,))
    reply = store.messages(chat.id)[-1]
    assert reply.tool_steps == (DENIED_STEP,)
    assert [v["tool_steps"] for v in reply.versions] == [(STEP,), (DENIED_STEP,)]


def test_a_loop_stopped_after_its_calls_is_kept_and_bad_steps_are_said(store):
    chat = store.create_session("tools")
    cancelled = RequestStats(finish_reason="cancelled")
    turn = ChatTurn.start(store, chat, "Files?")
    assert not ChatTurn.keeps("", cancelled)  # nothing made: as if never sent
    assert ChatTurn.keeps("", cancelled, tool_steps=(STEP,))  # the calls ran: kept
    assert turn.finish(store, "", cancelled, tool_steps=(STEP,))
    assert store.messages(chat.id)[-1].tool_steps == (STEP,)
    saved = ChatTurn.start(store, chat, "again").save(store, "x", DONE, tool_steps=[{}])
    assert not saved.stored and "tool steps cannot be saved: tool step 1" in saved.error
    assert len(store.messages(chat.id)) == 2
