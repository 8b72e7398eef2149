"""The decode batch: requests join a running batch with their first token as their next
input (no forward pass of their own), wait for a row when the batch is full, leave with
caches that hold exactly their tokens, and give the greedy replies they give alone."""

from __future__ import annotations

import pytest

from core.engine.types import DoneEvent
from tests.core.engine.helpers import (
    admit,
    done,
    finish,
    handle,
    no_locks,
    run_alone,
    scheduler,
    start,
)
from tests.core.engine.token_log import TokenLog

PROMPTS = (
    "the first question is this one",
    "and a second, different prompt",
    "a third one, a little longer than the others",
    "four",
)
MAX_TOKENS = (20, 2, 9, 5)  # the second joins with one token left


def _staggered(s, handles) -> None:
    """Start the first, step twice, start the second, step, start the rest back to back
    (``start``: admitted and prefilled, its first token taken)."""
    start(s, handles[0])
    s.step()
    s.step()
    start(s, handles[1])
    s.step()
    for h in handles[2:]:
        start(s, h)
    finish(s)


@pytest.mark.parametrize("max_rows", [16, 2])
def test_joining_a_running_batch_keeps_every_reply(loaded, max_rows, monkeypatch):
    """Alone against joining a running batch: different computations (GEMMs over other
    numbers of rows), so the greedy replies are compared token by token."""
    log = TokenLog(monkeypatch)
    s = scheduler(loaded)
    alone = [run_alone(s, handle(p, max_tokens=n)) for p, n in zip(PROMPTS, MAX_TOKENS)]
    tokens_alone = log.by_prompt()
    log.clear()
    s = scheduler(loaded)
    s.batch.max_rows = max_rows  # 2: the later requests wait for a row to leave
    handles = [handle(p, max_tokens=n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    _staggered(s, handles)
    together = [done(h) for h in handles]
    assert log.by_prompt() == tokens_alone
    assert [d.text for d in together] == [d.text for d in alone]
    assert [d.stats.completion_tokens for d in together] == [
        d.stats.completion_tokens for d in alone
    ]
    assert [d.stats.finish_reason for d in together] == [d.stats.finish_reason for d in alone]
    assert len(s.batch) == 0 and no_locks(s)
    assert s.cache.ram.tree.check_invariants() is None


def test_a_batched_reply_leaves_its_exact_cache(loaded):
    s = scheduler(loaded)
    handles = [handle(p, max_tokens=n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    _staggered(s, handles)
    first = [done(h) for h in handles]
    again = [run_alone(s, handle(p, max_tokens=n + 4)) for p, n in zip(PROMPTS, MAX_TOKENS)]
    for before, after in zip(first, again):
        assert after.stats.cached_tokens == after.stats.prompt_tokens - 1  # the prompt came back
        assert after.text.startswith(before.text)


@pytest.mark.parametrize("steps", [0, 1])
def test_cancel_right_after_joining(loaded, steps):
    s = scheduler(loaded)
    first, second = handle(PROMPTS[0], max_tokens=30), handle(PROMPTS[1], max_tokens=30)
    start(s, first)
    start(s, second)  # both in the batch now; the second has not been fed yet
    for _ in range(steps):
        s.step()
    second.cancel()
    finish(s)
    assert done(second).stats.finish_reason == "cancelled"
    assert done(first).stats.completion_tokens == 30
    assert len(s.batch) == 0 and no_locks(s)


def test_greedy_rows_give_mlx_lms_own_tokens(loaded):
    """The batch's greedy shortcut (argmax of the logits, not normalised first) picks the
    tokens mlx-lm's ``BatchGenerator`` picks for the same prompts."""
    from mlx_lm.generate import BatchGenerator

    from core.engine.engine import RequestHandle
    from core.engine.types import GenerationRequest, SamplingParams

    s = scheduler(loaded)
    tokenizer = s.loaded.tokenizer
    ids = [tokenizer.encode(p) for p in PROMPTS]
    handles = [
        RequestHandle(
            GenerationRequest(
                prompt_tokens=tuple(p), sampling=SamplingParams(temperature=0.0, max_tokens=12)
            )
        )
        for p in ids
    ]
    for h in handles:
        admit(s, h)
    finish(s)
    ours = [done(h).text for h in handles]
    generator = BatchGenerator(
        s.loaded.model, max_tokens=12, stop_tokens=[[e] for e in tokenizer.eos_token_ids]
    )
    uids = generator.insert(ids)
    theirs: dict[int, list[int]] = {uid: [] for uid in uids}
    finished: set[int] = set()
    while len(finished) < len(uids):
        for r in generator.next_generated():
            if r.token not in tokenizer.eos_token_ids:
                theirs[r.uid].append(r.token)
            if r.finish_reason is not None:
                finished.add(r.uid)
    generator.close()
    assert ours == [tokenizer.decode(theirs[u]) for u in uids]


def test_rows_ending_together_send_their_last_tokens_before_storing_caches(loaded, monkeypatch):
    """When several rows end at one step, every row's last token is sent before any of
    them stores its cache and sends its stats: the last rows' tokens do not wait for the
    others' stores."""
    from core.engine.engine import RequestHandle
    from core.engine.types import DoneEvent, TokenEvent

    if loaded.info.model_type != "llama":
        pytest.skip(
            "hybrid models prefill one prompt at a time: their rows join, so end, at different "
            "steps"
        )
    log: list[tuple[int, str]] = []
    emit = RequestHandle.emit

    def logged(self, event):
        log.append((id(self), type(event).__name__))
        emit(self, event)

    monkeypatch.setattr(RequestHandle, "emit", logged)
    s = scheduler(loaded)
    handles = [handle(p, max_tokens=6) for p in PROMPTS[:3]]
    for h in handles:
        admit(s, h)  # prefilled together, so they join the batch at one step
    finish(s)
    ends = {id(h): done(h) for h in handles}
    together = [h for h in handles if ends[id(h)].stats.finish_reason == "length"]
    assert len(together) >= 2 and len({ends[id(h)].stats.completion_tokens for h in together}) == 1
    for a in together:
        last_token = max(
            i for i, (who, kind) in enumerate(log) if who == id(a) and kind == TokenEvent.__name__
        )
        for b in together:
            stats_sent = next(
                i
                for i, (who, kind) in enumerate(log)
                if who == id(b) and kind == DoneEvent.__name__
            )
            assert last_token < stats_sent


def _of(namespace: str, text: str, max_tokens: int):
    from core.engine.engine import RequestHandle
    from core.engine.types import GenerationRequest, SamplingParams

    return RequestHandle(
        GenerationRequest(
            prompt_text=text,
            cache_namespace=namespace,
            sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
        )
    )


LONG = 120  # tokens: the greedy client's streams outlast the other's short request


@pytest.mark.faults
def test_a_client_with_every_row_makes_room_for_another_at_the_next_step(loaded):
    """Issue 26.4: 16 streams of key A held key B's 4-token request 77 s (until a row of A's
    ended). A row of A's is parked now: B decodes at once and ends before any of A's."""
    s = scheduler(loaded)
    s.batch.max_rows = 4
    greedy = [_of("key-a", f"stream {i} of the greedy client", LONG) for i in range(4)]
    for h in greedy:
        start(s, h)
    s.step()
    assert len(s.batched) == 4 and not s.batch._waiting
    other = _of("key-b", "the other client", 4)
    start(s, other)
    seen: dict = {h: [] for h in [*greedy, other]}

    def ended(h) -> bool:
        events, _ = h.take()
        seen[h] += events
        return any(isinstance(e, DoneEvent) for e in seen[h])

    steps = 0
    while not ended(other):
        s.step()
        steps += 1
        assert steps < LONG // 2, "the other client's request waited for a row"
    assert not any(ended(h) for h in greedy)
    assert s.batch.parked >= 1
    finish(s)
    assert all(ended(h) and seen[h][-1].stats.completion_tokens == LONG for h in greedy)


@pytest.mark.parametrize("max_rows", [2, 3])
def test_a_parked_row_gives_the_reply_it_gives_alone(loaded, max_rows):
    prompts = [
        ("key-a", "the first question is this one", 24),
        ("key-a", "and a second, different prompt", 30),
        ("key-a", "a third, a little longer than the others", 18),
        ("key-b", "the other client", 6),
        ("key-c", "and a third client", 9),
    ]
    s = scheduler(loaded)
    alone = [run_alone(s, _of(ns, text, n)) for ns, text, n in prompts]
    s = scheduler(loaded)
    s.batch.max_rows = max_rows
    handles = [_of(ns, text, n) for ns, text, n in prompts]
    for h in handles[:3]:
        start(s, h)
        s.step()
    for h in handles[3:]:
        start(s, h)
    finish(s)
    assert s.batch.parked >= 1
    together = [done(h) for h in handles]
    assert [d.text for d in together] == [d.text for d in alone]
    assert [d.stats.completion_tokens for d in together] == [
        d.stats.completion_tokens for d in alone
    ]
    assert len(s.batch) == 0 and no_locks(s)


@pytest.mark.faults
def test_a_new_clients_prompt_is_prefilled_before_a_busy_clients_next_ones(loaded):
    """Round robin: key A has streams running and more prompts waiting; key B's prompt, sent
    last, is prefilled first (chunk by chunk: a hybrid model's prompt goes in two calls, all
    but its last token and then that token, and one of A's takes a chunk between them)."""
    s = scheduler(loaded)
    s.prefill.batch_prefill = False
    running = [_of("key-a", f"running stream {i}", LONG) for i in range(2)]
    for h in running:
        start(s, h)
    queued = [_of("key-a", f"queued prompt {i}", 4) for i in range(3)]
    for h in queued:
        admit(s, h)
    other = _of("key-b+salt-ignored", "the other client", 4)
    admit(s, other)
    while any(job.state.handle is other for job in s.waiting):
        s.step()
    waiting = [job for job in s.waiting if job.state.handle in queued]
    assert len(waiting) == 3  # none of them has its first token
    assert sum(job.run is not None for job in waiting) <= 1  # at most one took a chunk
    for h in running + queued + [other]:
        h.cancel()
    finish(s)
