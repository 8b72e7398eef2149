"""A long prompt's prefill goes in a chunk per scheduler step, between the running streams'
decode steps (issue 19, finding 1: a long prompt stopped every stream until it was in);
replies are the same with interleaving on and off; cancel, the cache and priorities hold.

Measured in steps and event order, never in wall-clock time.
"""

from __future__ import annotations

import pytest

from core.engine.engine import RequestHandle
from core.engine.pacing import ChunkPacer
from core.engine.scheduler import Scheduler
from core.engine.types import CHAT_PRIORITY, GenerationRequest, ProgressEvent, SamplingParams
from tests.core.engine import helpers
from tests.core.engine.helpers import done, finish, start
from tests.core.engine.token_log import TokenLog

CHUNK = 32  # the pacer's largest chunk here: a 600-token prompt is ~19 chunks
LONG = "".join(chr(97 + (i * 7) % 26) for i in range(600))  # byte tokenizer: ~600 tokens


def scheduler(loaded, interleave: bool = True) -> Scheduler:
    return helpers.scheduler(
        loaded, pool_tokens=8192, pacer=ChunkPacer(largest=CHUNK), interleave=interleave
    )


class Watched(RequestHandle):
    """A handle that calls ``on_event(event)`` as the engine side emits each event."""

    def __init__(self, request, on_event=lambda event: None):
        super().__init__(request)
        self.on_event = on_event

    def emit(self, event):
        self.on_event(event)
        super().emit(event)


def request(text: str, max_tokens: int = 40, priority: int = 0) -> GenerationRequest:
    return GenerationRequest(
        prompt_text=text,
        priority=priority,
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )


def decoding(s: Scheduler, h: RequestHandle):
    return next(state for state in s.active if state.handle is h)


@pytest.mark.parametrize("streams", [1, 2])
def test_running_streams_get_tokens_between_the_chunks_of_a_long_prompt(long_loaded, streams):
    s = scheduler(long_loaded)
    running = [RequestHandle(request(f"stream {i} says", max_tokens=200)) for i in range(streams)]
    for h in running:
        start(s, h)
    states = [decoding(s, h) for h in running]  # solo (one stream) or in the batch (two)
    # at each progress event of the long prompt: each stream's tokens so far
    seen: list[list[int]] = []

    def on_event(event):
        if isinstance(event, ProgressEvent):
            seen.append([len(state.generated) for state in states])

    long = Watched(request(LONG, max_tokens=4), on_event)
    start(s, long)
    chunks = len(seen) - 1  # the first event is the prefill's start
    assert chunks >= 600 // CHUNK
    for before, after in zip(seen[1:], seen[2:]):  # between two chunks every stream took a step
        assert all(b == a + 1 for a, b in zip(before, after)), (before, after)
    finish(s)
    # nobody stopped early
    assert [done(h).stats.completion_tokens for h in running] == [200] * streams
    stats = done(long).stats
    assert stats.computed_tokens == stats.prompt_tokens


def test_nobody_decoding_a_prompt_goes_in_whole_chunks(long_loaded):
    s = scheduler(long_loaded)
    sizes: list[int] = []
    h = Watched(
        request(LONG, max_tokens=2),
        lambda e: sizes.append(e.done) if isinstance(e, ProgressEvent) else 0,
    )
    start(s, h)
    steps = [b - a for a, b in zip(sizes, sizes[1:])]
    assert max(steps) == CHUNK and len(steps) <= 600 // CHUNK + 2


def _together(loaded, interleave: bool, cancel_long_after: int | None = None):
    """A short stream, then a long prompt while it decodes, then a third request behind it;
    their DoneEvents."""
    s = scheduler(loaded, interleave)
    first = RequestHandle(request("a short question", max_tokens=60))
    start(s, first)
    for _ in range(3):
        s.step()
    chunks = []

    def on_event(event):
        if isinstance(event, ProgressEvent):
            chunks.append(event.done)
            if cancel_long_after is not None and len(chunks) > cancel_long_after:
                long.cancel()

    long = Watched(request(LONG, max_tokens=30), on_event)
    third = RequestHandle(request("and a third one", max_tokens=30))
    helpers.admit(s, long)
    helpers.admit(s, third)
    finish(s)
    assert s.cache.ram.stats().pages_locked == 0 and s.cache.ram.tree.check_invariants() is None
    return s, [done(h) for h in (first, long, third)]


def test_greedy_replies_are_the_same_with_interleaving_on_and_off(long_loaded, monkeypatch):
    """Different computations (a prompt in chunks between decode steps against whole, rows
    decoded in other batches): the same greedy tokens, one by one."""
    log = TokenLog(monkeypatch)
    _, on = _together(long_loaded, True)
    tokens_on = log.by_prompt()
    log.clear()
    _, off = _together(long_loaded, False)
    assert tokens_on == log.by_prompt()
    assert [d.text for d in on] == [d.text for d in off]
    assert [d.stats.completion_tokens for d in on] == [d.stats.completion_tokens for d in off]
    alone = scheduler(long_loaded)
    h = RequestHandle(request(LONG, max_tokens=30))
    start(alone, h)
    finish(alone)
    assert log.of(h) == tokens_on[LONG]
    assert done(h).text == on[1].text


def test_an_interleaved_prompt_is_cached_exactly(long_loaded):
    s, (_, long, _) = _together(long_loaded, True)
    again = RequestHandle(request(LONG, max_tokens=30))
    start(s, again)
    finish(s)
    reply = done(again)
    # hybrid: the snapshot before the last token
    assert reply.stats.cached_tokens == reply.stats.prompt_tokens - 1
    assert reply.text == long.text


def test_cancel_mid_prefill_while_others_decode(long_loaded):
    s, (first, long, third) = _together(long_loaded, True, cancel_long_after=3)
    assert long.stats.finish_reason == "cancelled" and long.stats.completion_tokens == 0
    assert first.stats.completion_tokens == 60 and third.stats.completion_tokens == 30
    _, (first_off, _, third_off) = _together(long_loaded, False)
    assert (first.text, third.text) == (first_off.text, third_off.text)


def test_a_request_cancelled_while_waiting_ends_without_running(long_loaded):
    s = scheduler(long_loaded)
    first = RequestHandle(request("running", max_tokens=30))
    start(s, first)
    long, queued = RequestHandle(request(LONG)), RequestHandle(request("queued"))
    helpers.admit(s, long)
    helpers.admit(s, queued)
    queued.cancel()
    s.step()
    assert [job.state.handle for job in s.waiting] == [long]
    stats = done(queued).stats
    assert stats.finish_reason == "cancelled" and stats.computed_tokens == 0
    finish(s)


def test_the_chat_window_goes_before_waiting_api_requests(long_loaded):
    s = scheduler(long_loaded)
    running = RequestHandle(request("already streaming", max_tokens=200))
    start(s, running)
    order: list[str] = []

    def first_token(name):
        return lambda event: (
            order.append(name) if not isinstance(event, ProgressEvent) and name not in order else 0
        )

    api = Watched(request(LONG, max_tokens=5), first_token("api"))
    low = Watched(request("a background job", max_tokens=5, priority=5), first_token("low"))
    helpers.admit(s, low)
    helpers.admit(s, api)
    for _ in range(3):  # the API's long prompt has started
        s.step()
    assert s.waiting[0].run is not None or s.waiting[1].run is not None
    chat = Watched(
        request("the person's question", max_tokens=5, priority=CHAT_PRIORITY), first_token("chat")
    )
    helpers.admit(s, chat)
    finish(s)
    assert order == ["chat", "api", "low"]  # the chat overtook the API prompt already prefilling
    assert all(done(h).stats.finish_reason == "length" for h in (api, low, chat, running))
