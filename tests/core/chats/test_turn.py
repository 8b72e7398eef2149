"""What one chat turn does (core.chats.turn), shared by ``radixchat chat`` and the window."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from core.chats.store import ChatStore
from core.chats.turn import ChatTurn, engine_figures, last_turn_start
from core.engine.types import (
    CHAT_PRIORITY,
    ChatMessage,
    GenerationRequest,
    RequestStats,
    SamplingParams,
)

DONE = RequestStats(
    prompt_tokens=12, cached_tokens=8, computed_tokens=4, completion_tokens=3, ttft_s=0.25
)


@pytest.fixture
def store(tmp_path):
    with ChatStore(tmp_path / "chats.db") as store:
        yield store


def _chat(store: ChatStore, system: str | None = None):
    session = store.create_session(name="work", system_prompt=system)
    store.add_turn(session.id, "one", "reply one", {"completion_tokens": 5})
    store.add_turn(session.id, "two", "reply two", {"completion_tokens": 6})
    return store.get_session_by_id(session.id)


def _stored(store: ChatStore, session) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in store.messages(session.id)]


def test_messages_are_the_system_prompt_the_history_and_the_question(store):
    session = _chat(store, system="Be brief.")
    turn = ChatTurn.start(store, session, "three")
    assert turn.messages == (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "one"),
        ChatMessage("assistant", "reply one"),
        ChatMessage("user", "two"),
        ChatMessage("assistant", "reply two"),
        ChatMessage("user", "three"),
    )
    assert turn.history == turn.messages[:-1]
    assert turn.kept_stats == [{"completion_tokens": 5}, {"completion_tokens": 6}]
    request = turn.request(SamplingParams(temperature=0.0), use_cache=False)
    assert request.messages == turn.messages and request.session == "work"
    assert request.sampling == SamplingParams(temperature=0.0) and request.use_cache is False
    assert request.priority == CHAT_PRIORITY < GenerationRequest().priority  # before API requests


def test_no_system_prompt_no_system_message(store):
    session = _chat(store)
    assert [m.role for m in ChatTurn.start(store, session, "three").messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]


def test_a_reply_is_stored_with_its_figures(store):
    session = _chat(store)
    turn = ChatTurn.start(store, session, "three")
    assert turn.finish(store, "reply three", DONE)
    assert _stored(store, session)[-2:] == [("user", "three"), ("assistant", "reply three")]
    assert store.messages(session.id)[-1].stats == dataclasses.asdict(DONE)


def test_a_reply_stopped_before_any_text_is_not_stored(store):
    session = _chat(store)
    before = _stored(store, session)
    stopped = dataclasses.replace(DONE, completion_tokens=0, finish_reason="cancelled")
    turn = ChatTurn.start(store, session, "three")
    assert not turn.keeps("", stopped)
    assert not turn.finish(store, "", stopped)
    assert not turn.finish(store, "", None)  # ended with no figures and no text (the window closed)
    assert _stored(store, session) == before


def test_a_reply_stopped_after_some_text_is_kept(store):
    session = _chat(store)
    stopped = dataclasses.replace(DONE, finish_reason="cancelled")
    assert ChatTurn.start(store, session, "three").finish(store, "par", stopped)
    assert _stored(store, session)[-1] == ("assistant", "par")
    assert store.messages(session.id)[-1].stats["finish_reason"] == "cancelled"
    # kept without the engine's figures (the window closed mid-reply): marked interrupted
    assert ChatTurn.start(store, session, "four").finish(store, "half a", None)
    assert _stored(store, session)[-1] == ("assistant", "half a")
    assert store.messages(session.id)[-1].stats == {"finish_reason": "interrupted"}
    assert engine_figures([store.messages(session.id)[-1].stats]) == []


def test_an_empty_reply_that_was_not_stopped_is_stored(store):
    session = _chat(store)
    # the model said nothing: a reply
    assert ChatTurn.start(store, session, "three").finish(store, "", DONE)
    assert _stored(store, session)[-1] == ("assistant", "")


def test_regenerate_and_edit_replace_the_last_turn(store):
    session = _chat(store, system="Be brief.")
    turn = ChatTurn.start(store, session, "two, edited", replace=True)
    assert [m.content for m in turn.messages] == ["Be brief.", "one", "reply one", "two, edited"]
    # what the window gives back
    assert [(m.role, m.content) for m in turn.stored] == _stored(store, session)
    assert turn.kept_stats == [{"completion_tokens": 5}]
    assert turn.finish(store, "reply two, again", DONE)
    assert _stored(store, session) == [
        ("user", "one"),
        ("assistant", "reply one"),
        ("user", "two, edited"),
        ("assistant", "reply two, again"),
    ]


def test_replacing_a_stopped_reply_changes_nothing(store):
    session = _chat(store)
    before = _stored(store, session)
    turn = ChatTurn.start(store, session, "two", replace=True)
    assert not turn.finish(store, "", dataclasses.replace(DONE, finish_reason="cancelled"))
    assert _stored(store, session) == before


def test_last_turn_start(store):
    session = _chat(store)
    messages = store.messages(session.id)
    assert last_turn_start([]) == 0
    assert last_turn_start(messages) == 2  # a user message and its reply
    assert last_turn_start(messages[:3]) == 2  # a user message left without a reply
    assert last_turn_start(messages[:1]) == 0


def test_the_turn_needs_neither_mlx_nor_qt():
    code = (
        "import sys, core.chats.turn, core.cli.chat; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'PySide6')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def _full_once(store, monkeypatch, reason: str = "full", times: int = 1) -> None:
    """The store's add_turn fails ``times`` times as a full disk (or ``reason``) does."""
    from core.errors import StoreError

    real, left = store.add_turn, [times]

    def add_turn(*args, **kwargs):
        if left[0]:
            left[0] -= 1
            error = StoreError(f"the disk is full: cannot write {store.path}")
            error.reason = reason
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "add_turn", add_turn)


def test_save_lets_the_history_win_over_the_cache_on_a_full_disk(store, monkeypatch):
    session = _chat(store)
    _full_once(store, monkeypatch)
    asked = []
    saved = ChatTurn.start(store, session, "three").save(
        store, "reply three", DONE, make_room=lambda: asked.append(1) or 3_000_000
    )
    assert saved.stored and saved.error is None and saved.cache_freed == 3_000_000 and asked == [1]
    assert _stored(store, session)[-2:] == [("user", "three"), ("assistant", "reply three")]


@pytest.mark.parametrize(
    "reason, freed, times", [("locked", 10, 1), ("full", 0, 1), ("full", 10, 2)]
)
def test_save_never_raises_and_says_why(store, monkeypatch, reason, freed, times):
    session = _chat(store)
    _full_once(store, monkeypatch, reason, times)
    asked = []
    saved = ChatTurn.start(store, session, "three").save(
        store, "reply three", DONE, make_room=lambda: asked.append(1) or freed
    )
    assert not saved.stored and "the disk is full" in saved.error
    assert asked == ([] if reason == "locked" else [1])  # only a full disk asks the cache to go
    assert len(_stored(store, session)) == 4


def test_a_message_whose_role_was_not_read_back_is_left_out_of_the_turn(store):
    import sqlite3

    session = _chat(store)
    with sqlite3.connect(store.path) as conn:
        conn.execute("PRAGMA ignore_check_constraints = 1")
        conn.execute("UPDATE messages SET role = 'usxr' WHERE seq = 3")
    turn = ChatTurn.start(store, session, "three")
    assert [m.content for m in turn.history] == ["one", "reply one", "reply two"]


def test_a_replys_thinking_is_stored_and_goes_back_with_the_history(store):
    session = store.create_session(name="thinker")
    turn = ChatTurn.start(store, session, "2+2?")
    stats = dataclasses.replace(DONE, reasoning_tokens=6)
    assert turn.finish(store, "4", stats, reasoning="Two and two.")
    reply = store.messages(session.id)[-1]
    assert (reply.content, reply.reasoning, reply.stats["reasoning_tokens"]) == (
        "4",
        "Two and two.",
        6,
    )
    follow = ChatTurn.start(store, session, "sure?")
    assert follow.messages[1] == ChatMessage("assistant", "4", reasoning="Two and two.")


def test_a_reply_stopped_while_thinking_is_kept_with_its_thinking(store):
    session = store.create_session(name="stopped")
    turn = ChatTurn.start(store, session, "hard question")
    stopped = dataclasses.replace(DONE, finish_reason="cancelled")
    assert turn.keeps("", stopped, "Let me think") and not turn.keeps("", stopped)
    assert turn.save(store, "", stopped, reasoning="Let me think").stored
    assert store.messages(session.id)[-1].reasoning == "Let me think"
