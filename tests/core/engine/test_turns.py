"""Prefill shared between clients (issue 42.2): key B's 4-token chat waited 99.6 s behind key
A's one 6,064-token prompt, and 41.2 s behind three of A's queued prompts, because a prompt
kept every chunk until its prefill was done. Now each chunk goes to the client served least
recently (by priority first, within a client by arrival), and a client's queue is capped.

The order on plain values first, then on a tiny model through the scheduler and the engine:
measured in events and steps, never in wall-clock time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from core.engine.engine import RequestHandle
from core.engine.namespaces import for_key, with_salt
from core.engine.pacing import ChunkPacer
from core.engine.turns import PrefillSharing, PrefillTurns, Turn
from core.engine.types import (
    CHAT_PRIORITY,
    DoneEvent,
    ErrorEvent,
    GenerationRequest,
    ProgressEvent,
    SamplingParams,
)
from core.errors import ErrorKind, TooManyWaitingError
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.engine import helpers
from tests.core.engine.helpers import admit, done, finish, start_engine

CHUNK = 32  # the pacer's largest chunk: a 600-token prompt is ~19 chunks
LONG = "".join(chr(97 + (i * 7) % 26) for i in range(600))  # byte tokenizer: ~600 tokens
KEY_A, KEY_B, KEY_C = for_key("a"), for_key("b"), for_key("c")


# ---------------------------------------------------------------- the order, on plain values


@dataclass
class Job:
    name: str
    turn: Turn


def job(name: str, client: str, arrival: int, priority: int = 0) -> Job:
    return Job(name, Turn(client, priority, arrival))


def names(jobs) -> list[str]:
    return [j.name for j in jobs]


def test_each_client_in_turn_then_each_clients_next_prompt():
    turns = PrefillTurns()
    waiting = [
        job("a1", "a", 1),
        job("a2", "a", 2),
        job("a3", "a", 3),
        job("b1", "b", 4),
        job("c1", "c", 5),
        job("b2", "b", 6),
    ]
    assert names(turns.order(waiting)) == ["a1", "b1", "c1", "a2", "b2", "a3"]


def test_the_client_served_least_recently_goes_first():
    turns = PrefillTurns()
    long_a, short_b = job("long a", "a", 1), job("short b", "b", 2)
    assert names(turns.order([long_a])) == ["long a"]
    turns.served("a")  # a's long prompt took a chunk; then b's arrives
    assert names(turns.order([long_a, short_b])) == ["short b", "long a"]
    turns.served("b")
    assert names(turns.order([long_a, short_b])) == ["long a", "short b"]  # back and forth
    turns.served("a")
    turns.served("c")
    turns.served("b")
    assert names(turns.order([job("c", "c", 9), long_a, short_b])) == ["long a", "c", "short b"]


def test_priority_goes_before_the_round_robin():
    """The chat window's turns (CHAT_PRIORITY) before every API request, however recently
    the app was served; an API request that asks to wait longer waits."""
    turns = PrefillTurns()
    turns.served("b")
    turns.served("app")
    waiting = [
        job("background", "a", 1, priority=5),
        job("api", "b", 2),
        job("chat", "app", 3, priority=CHAT_PRIORITY),
        job("chat 2", "app", 4, priority=CHAT_PRIORITY),
    ]
    assert names(turns.order(waiting)) == ["chat", "chat 2", "api", "background"]


def test_within_a_client_by_priority_then_arrival():
    turns = PrefillTurns()
    waiting = [job("late", "a", 1, priority=3), job("soon", "a", 2), job("b", "b", 3)]
    assert names(turns.order(waiting)) == ["soon", "b", "late"]


def test_a_forgotten_client_goes_first_as_a_new_one(monkeypatch):
    import core.engine.turns as turns_module

    monkeypatch.setattr(turns_module, "REMEMBERED_CLIENTS", 4)
    turns = PrefillTurns()
    for client in "abcde":
        turns.served(client)
    # a, b (least recently served) forgotten: they go first, as they would have
    assert names(turns.order([job("e", "e", 1), job("a", "a", 2), job("c", "c", 3)])) == [
        "a",
        "c",
        "e",
    ]


def test_a_client_may_have_at_most_max_waiting_prompts_waiting():
    turns = PrefillTurns(max_waiting=2)
    waiting = [job("a1", "a", 1), job("a2", "a", 2), job("b1", "b", 3)]
    with pytest.raises(TooManyWaitingError) as refused:
        turns.check_room("a", waiting)
    assert refused.value.kind is ErrorKind.TOO_MANY_WAITING
    assert "2 prompts queued" in str(refused.value) and "--max-waiting" in str(refused.value)
    turns.check_room("b", waiting)  # another client's queue is its own
    with pytest.raises(ValueError):
        PrefillTurns(max_waiting=0)


# ---------------------------------------------------------------- through the scheduler


def scheduler(loaded, **options):
    return helpers.scheduler(loaded, pool_tokens=8192, pacer=ChunkPacer(largest=CHUNK), **options)


class Logged(RequestHandle):
    """A handle whose events are logged as the engine side emits them, in one shared
    ``log`` of (name, event): the order the engine thread made them in."""

    def __init__(self, request, name: str, log: list):
        super().__init__(request)
        self.name, self.log = name, log

    def emit(self, event):
        self.log.append((self.name, event))
        super().emit(event)


def ask(text: str, namespace: str, max_tokens: int = 4, priority: int = 0) -> GenerationRequest:
    return GenerationRequest(
        prompt_text=text,
        cache_namespace=namespace,
        priority=priority,
        use_cache=False,
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )


def first_answer(log: list, name: str) -> int:
    """Where ``name``'s first token (or its end) is in ``log``."""
    return next(
        i for i, (who, e) in enumerate(log) if who == name and not isinstance(e, ProgressEvent)
    )


def prefilled(log: list, name: str) -> int:
    """Where ``name``'s prefill ended in ``log`` (its last prompt token in)."""
    return next(
        i
        for i, (who, e) in enumerate(log)
        if who == name and isinstance(e, ProgressEvent) and e.done == e.total and e.done
    )


def chunk_owners(log: list) -> list[str]:
    """Whose prompt each prefill chunk was, in order (a prefill's first event is its start)."""
    seen: dict[str, int] = {}
    owners = []
    for who, event in log:
        if isinstance(event, ProgressEvent):
            if who in seen and event.done > seen[who]:
                owners.append(who)
            seen[who] = event.done
    return owners


def test_another_keys_short_prompt_goes_in_before_a_long_prompt_half_prefilled(long_loaded):
    s, log = scheduler(long_loaded), []
    long = Logged(ask(LONG, KEY_A, max_tokens=2), "long", log)
    admit(s, long)
    for _ in range(3):
        s.step()  # three chunks of the long prompt are in
    short = Logged(ask("hi", KEY_B), "short", log)
    admit(s, short)
    finish(s)
    assert first_answer(log, "short") < prefilled(log, "long")
    # one chunk of the long prompt at most went in between (a hybrid model prefills the
    # short prompt in two calls: all but its last token, then that token)
    owners = chunk_owners(log)
    assert owners[:3] == ["long"] * 3 and "short" in owners[3:5]
    assert done(short).stats.finish_reason == done(long).stats.finish_reason == "length"
    assert helpers.no_locks(s)


def test_another_keys_short_prompt_goes_in_before_a_queue_of_long_prompts(long_loaded):
    # one at a time: the tiny model prefills so fast that its pacer lets the three go in one
    # batched forward (test_pacing bounds that forward by the same budget as a chunk)
    s, log = scheduler(long_loaded, batch_prefill=False), []
    queue = [Logged(ask(LONG + str(i), KEY_A, max_tokens=2), f"long {i}", log) for i in range(3)]
    for h in queue:
        admit(s, h)
    s.step()
    s.step()
    short = Logged(ask("hi", with_salt(KEY_B, "its own salt"), max_tokens=2), "short", log)
    admit(s, short)
    finish(s)
    assert first_answer(log, "short") < prefilled(log, "long 0")
    # A's queue in arrival order, one prompt at a time
    assert prefilled(log, "long 0") < prefilled(log, "long 1") < prefilled(log, "long 2")
    owners = [who for who in chunk_owners(log) if who != "short"]
    assert owners == sorted(owners)  # long 1 took no chunk before long 0 was in


def test_three_keys_long_prompts_take_chunks_in_turn(long_loaded):
    s, log = scheduler(long_loaded, batch_prefill=False), []
    for name, key in (("a", KEY_A), ("b", KEY_B), ("c", KEY_C)):
        admit(s, Logged(ask(LONG + name, key, max_tokens=2), name, log))
    finish(s)
    owners = chunk_owners(log)
    assert owners[:9] == ["a", "b", "c"] * 3


def test_a_chat_turn_keeps_every_chunk_before_api_requests(long_loaded):
    """The chat window's long turn is not shared with an API key's short request that
    arrives while it is prefilled: a person is watching it."""
    s, log = scheduler(long_loaded), []
    chat = Logged(ask(LONG, "app", max_tokens=2, priority=CHAT_PRIORITY), "chat", log)
    admit(s, chat)
    s.step()
    admit(s, Logged(ask("hi", KEY_B), "api", log))
    finish(s)
    assert prefilled(log, "chat") < first_answer(log, "api")
    assert set(chunk_owners(log)[: prefilled_chunks(log, "chat")]) == {"chat"}


def prefilled_chunks(log: list, name: str) -> int:
    return chunk_owners(log).count(name)


def test_without_the_round_robin_the_long_prompt_keeps_every_chunk(long_loaded):
    """The order before the round robin (kept for the bench's side-by-side figures): the
    short prompt waited for the whole long one. The check above fails on it."""
    s, log = scheduler(long_loaded, sharing=PrefillSharing(round_robin=False)), []
    admit(s, Logged(ask(LONG, KEY_A, max_tokens=2), "long", log))
    s.step()
    admit(s, Logged(ask("hi", KEY_B), "short", log))
    finish(s)
    assert prefilled(log, "long") < first_answer(log, "short")


def test_one_prompt_past_a_keys_cap_is_refused_at_once(long_loaded):
    s = scheduler(long_loaded, sharing=PrefillSharing(max_waiting=2))
    mine = [RequestHandle(ask(f"prompt {i}", KEY_A)) for i in range(2)]
    for h in mine:
        admit(s, h)
    with pytest.raises(TooManyWaitingError):
        admit(s, RequestHandle(ask("one more", with_salt(KEY_A, "a salt is the same key"))))
    other = RequestHandle(ask("another key's", KEY_B))
    admit(s, other)  # its own queue
    while any(job.state.handle is mine[0] for job in s.waiting):
        s.step()
    admit(s, RequestHandle(ask("now there is room", KEY_A)))
    finish(s)
    assert all(done(h).stats.finish_reason == "length" for h in [*mine, other])


# ---------------------------------------------------------------- through the engine


@pytest.fixture(scope="module")
def context_model(tmp_path_factory):
    """The tiny llama with a 4096-token context: a prompt of many chunks."""
    return write_tiny_model(
        tmp_path_factory.mktemp("turns") / "m",
        TinyModelSpec(num_layers=2, max_position_embeddings=4096),
    )


def test_engine_a_second_keys_short_prompt_answers_before_a_long_prompt_is_in(
    context_model, tmp_path
):
    """Key B's short prompt, sent once key A's long prompt has its first chunk in, gets its
    first token before that prompt's prefill is done. The order is the engine thread's
    (events logged as they are emitted); B is sent from inside A's first progress event and
    the engine thread waits there until B is queued, so no timing decides it."""
    engine = start_engine(tmp_path / "data", context_model, pool_tokens=8192, disk_cache=False)
    log: list = []
    lock = threading.Lock()
    handles: dict[str, RequestHandle] = {}
    ended = {"long": threading.Event(), "short": threading.Event()}

    def on_events(name: str):
        def wake():
            with lock:
                events, over = handles[name].take()
                log.extend((name, event) for event in events)
                on_engine = threading.current_thread().name == "radixchat-engine"
                send = name == "long" and "short" not in handles and on_engine
                send = send and any(
                    isinstance(e, ProgressEvent) and 0 < e.done < e.total for e in events
                )
                if send:
                    handles["short"] = engine.submit(ask("hi there", KEY_B, max_tokens=2))
            if over:
                ended[name].set()
            if send:  # on the engine thread, in the long prompt's chunk: until B is queued
                deadline = time.monotonic() + 30
                while engine._prompt_threads.rendering and time.monotonic() < deadline:
                    time.sleep(0.001)
                handles["short"].on_events(on_events("short"))

        return wake

    try:
        with lock:
            handles["long"] = engine.submit(ask("x" * 3000, KEY_A, max_tokens=1))
        handles["long"].on_events(on_events("long"))
        assert ended["long"].wait(60) and ended["short"].wait(60)
        with lock:
            assert not any(isinstance(e, ErrorEvent) for _, e in log), log
            assert first_answer(log, "short") < prefilled(log, "long")
            assert isinstance(log[-1][1], DoneEvent)
    finally:
        engine.shutdown()
