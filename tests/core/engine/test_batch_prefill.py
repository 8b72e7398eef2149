"""Batched prefill: prompts that wait together go in one padded forward and start decoding
together (issue 19, point 5: ``mlx_lm.server`` prefills its waiting prompts as one batch),
with the replies and the cached pages of the one-at-a-time path.

Measured in forwards and events, never in wall-clock time.
"""

from __future__ import annotations

import threading
import time

import mlx.core as mx
import numpy as np
import pytest

from core.engine import batch_prefill
from core.engine.config import EngineConfig
from core.engine.scheduler import Scheduler
from core.engine.types import GenerationRequest, SamplingParams, TokenEvent
from tests.core.engine import helpers
from tests.core.engine.helpers import done, finish, handle, no_locks
from tests.core.engine.token_log import TokenLog

SYSTEM = "You are a careful assistant who answers in full sentences. "  # ~60 tokens, shared
PROMPTS = (
    "the first question is this one",
    "and a second, different prompt that is longer than that",
    "x",
    "a fourth, of middling length",
)


def scheduler(loaded, batched: bool = True) -> Scheduler:
    return helpers.scheduler(loaded, pool_tokens=8192, batch_prefill=batched)


class Forwards:
    """Counts the model's backbone calls (every prefill chunk and decode step is one),
    with the batch size of each; ``during`` runs inside each call."""

    def __init__(self, monkeypatch, loaded, during=lambda inputs: None):
        self.calls: list[tuple[int, int]] = []  # (rows, tokens per row)
        backbone = type(loaded.model.model)
        original = backbone.__call__

        def counted(module, inputs, *args, **kwargs):
            self.calls.append(tuple(inputs.shape[:2]))
            during(inputs)
            return original(module, inputs, *args, **kwargs)

        monkeypatch.setattr(backbone, "__call__", counted)


def texts(shared: bool) -> list[str]:
    return [SYSTEM + p if shared else p for p in PROMPTS]


def run(
    loaded, batched: bool, shared: bool, warm: str | None = None, **sampling
) -> tuple[Scheduler, list]:
    """Every prompt admitted at once (``warm``: a request run first, whose prompt the others
    extend); their DoneEvents."""
    s = scheduler(loaded, batched)
    if warm is not None:
        h = handle(warm, max_tokens=3)
        helpers.admit(s, h)
        finish(s)
    handles = [
        handle(t, max_tokens=24 - 5 * i, **(sampling if i == 1 else {}))
        for i, t in enumerate(texts(shared))
    ]
    for h in handles:
        helpers.admit(s, h)
    finish(s)
    assert no_locks(s)
    return s, [done(h) for h in handles]


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("sampling", [{}, {"repetition_penalty": 1.3}])
def test_greedy_replies_are_the_same_with_batched_prefill_on_and_off(
    long_loaded, shared, sampling, monkeypatch
):
    """Different computations (one padded forward over every prompt against each alone):
    the same greedy tokens, one by one."""
    log = TokenLog(monkeypatch)
    _, on = run(long_loaded, True, shared, **sampling)
    tokens_on = log.by_prompt()
    log.clear()
    _, off = run(long_loaded, False, shared, **sampling)
    assert tokens_on == log.by_prompt()
    assert [d.text for d in on] == [d.text for d in off]
    assert [d.stats.completion_tokens for d in on] == [d.stats.completion_tokens for d in off]
    assert [d.stats.finish_reason for d in on] == [d.stats.finish_reason for d in off]


def test_rows_with_different_cached_prefixes(long_loaded, monkeypatch):
    """A prefix in the cache: the rows that extend it start from it, the others from
    nothing, in the same forward (the merge left-pads the shorter caches). Different
    computations: the same greedy tokens, one by one."""
    warm = SYSTEM + "warm up"
    log = TokenLog(monkeypatch)
    _, on = run(long_loaded, True, True, warm=warm)
    tokens_on = log.by_prompt()
    log.clear()
    _, off = run(long_loaded, False, True, warm=warm)
    assert tokens_on == log.by_prompt()
    assert [d.text for d in on] == [d.text for d in off]
    assert [d.stats.cached_tokens for d in on] == [d.stats.cached_tokens for d in off]
    if long_loaded.info.name and not _hybrid(long_loaded):
        # the shared system prompt came from the tree
        assert min(d.stats.cached_tokens for d in on) > 0


def _hybrid(loaded) -> bool:
    return scheduler(loaded).cache.ram.hybrid


def test_the_pages_are_cached_exactly(long_loaded):
    s_on, on = run(long_loaded, True, True)
    s_off, _ = run(long_loaded, False, True)
    for d_on, text in zip(on, texts(True)):
        again_on, again_off = handle(text, max_tokens=30), handle(text, max_tokens=30)
        helpers.admit(s_on, again_on)
        finish(s_on)
        helpers.admit(s_off, again_off)
        finish(s_off)
        again_on, again_off = done(again_on), done(again_off)
        # the pages each tree cached (batched, or one at a time: different computations)
        # give the same greedy replies
        assert again_on.stats.cached_tokens == again_off.stats.cached_tokens
        assert again_on.stats.cached_tokens == again_on.stats.prompt_tokens - 1
        assert again_on.text == again_off.text
        assert again_on.text.startswith(d_on.text)
    if _hybrid(long_loaded):
        return
    for text in texts(True):
        tokens = s_on.loaded.tokenizer.encode(text)[:8]  # the start of each prompt, in both trees
        for (k_on, v_on), (k_off, v_off) in zip(
            s_on.cache.ram.cached_kv(tokens), s_off.cache.ram.cached_kv(tokens)
        ):
            np.testing.assert_allclose(np.array(k_on), np.array(k_off), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(np.array(v_on), np.array(v_off), rtol=1e-4, atol=1e-5)


def test_waiting_prompts_take_one_forward(long_loaded, monkeypatch):
    """Four prompts waiting: one step prefills them in one forward and all four have their
    first token (one at a time, the step prefills one). A hybrid model keeps one at a time."""
    s = scheduler(long_loaded)
    handles = [handle(t, max_tokens=24) for t in texts(False)]
    for h in handles:
        helpers.admit(s, h)
    forwards = Forwards(monkeypatch, long_loaded)
    s.step()
    if s.cache.ram.hybrid:
        assert forwards.calls and all(rows == 1 for rows, _ in forwards.calls)  # one prompt's chunk
        assert len(s.waiting) >= 3
    else:
        assert forwards.calls == [(4, max(len(s.loaded.tokenizer.encode(t)) for t in texts(False)))]
        assert not s.waiting and len(s.batched) == 4
        assert all(any(isinstance(e, TokenEvent) for e in h.events(timeout=0)) for h in handles)
    monkeypatch.undo()
    finish(s)


def test_a_running_stream_keeps_decoding_and_the_rows_join_it(long_loaded, monkeypatch):
    """A stream decodes while three prompts wait: the next step is its decode step plus one
    forward for the three, which then decode with it (4 rows). (Its prompt is long enough
    for the pacer to measure a rate from: until it has one, the budget is the smallest chunk.)"""
    s = scheduler(long_loaded)
    running = handle("already streaming, after a prompt long enough to measure", max_tokens=40)
    helpers.admit(s, running)
    s.step()
    s.step()
    for t in PROMPTS[:3]:
        helpers.admit(s, handle(t, max_tokens=24))
    forwards = Forwards(monkeypatch, long_loaded)
    s.step()
    if not s.cache.ram.hybrid:
        assert [rows for rows, _ in forwards.calls] == [1, 3]  # its decode step, then the three
        s.step()
        assert forwards.calls[-1] == (4, 1)
    monkeypatch.undo()
    finish(s)
    assert done(running).stats.completion_tokens == 40 and no_locks(s)


def test_a_budget_too_small_for_two_keeps_one_at_a_time(long_loaded, monkeypatch):
    monkeypatch.setattr(batch_prefill, "IDLE_TOKENS", 1)
    s = scheduler(long_loaded)
    for t in PROMPTS:
        helpers.admit(s, handle(t, max_tokens=24))
    s.step()
    assert len(s.waiting) >= 3  # one prompt at most got its first token
    finish(s)
    assert no_locks(s)


def test_cancel_of_a_row_during_a_batched_prefill(long_loaded, monkeypatch):
    s = scheduler(long_loaded)
    if s.cache.ram.hybrid:
        pytest.skip(
            "a hybrid model's prompts go one at a time (test_waiting_prompts_take_one_forward)"
        )
    handles = [handle(t, max_tokens=24 - 5 * i) for i, t in enumerate(texts(True))]  # as run() does
    for h in handles:
        helpers.admit(s, h)

    def cancel_the_second(inputs):
        if inputs.shape[0] > 1:
            handles[1].cancel()

    Forwards(monkeypatch, long_loaded, cancel_the_second)
    finish(s)
    monkeypatch.undo()
    cancelled = done(handles[1]).stats
    assert cancelled.finish_reason == "cancelled" and cancelled.completion_tokens == 0
    assert no_locks(s) and len(s.batch) == 0
    _, off = run(long_loaded, False, True)
    kept = [0, 2, 3]
    assert [done(handles[i]).text for i in kept] == [off[i].text for i in kept]
    # its prompt was in when it was cancelled: kept, and the same prompt again reads it
    again = helpers.run_alone(s, handle(texts(True)[1], max_tokens=4)).stats
    assert again.cached_tokens == again.prompt_tokens - 1


def test_a_row_done_at_its_first_token_leaves_and_is_cached(long_loaded):
    s = scheduler(long_loaded)
    one, more = handle(PROMPTS[0], max_tokens=1), handle(PROMPTS[1], max_tokens=10)
    helpers.admit(s, one)
    helpers.admit(s, more)
    finish(s)
    assert done(more).stats.completion_tokens == 10
    again = handle(PROMPTS[0], max_tokens=4)
    helpers.admit(s, again)
    finish(s)
    again, one = done(again), done(one)
    assert one.stats.completion_tokens == 1
    assert again.stats.cached_tokens == again.stats.prompt_tokens - 1
    assert again.text.startswith(one.text) and no_locks(s)


def test_rows_that_fit():
    assert batch_prefill.rows_that_fit([10, 20, 5], 60) == 3
    assert batch_prefill.rows_that_fit([10, 20, 5], 59) == 2  # 3 x 20 > 59
    assert batch_prefill.rows_that_fit([30, 40], 60) == 1
    assert batch_prefill.rows_that_fit([61], 60) == 0
    assert batch_prefill.rows_that_fit([1] * 20, 100, rows=8) == 8


def test_rows_logits_equal_each_prompt_alone(long_loaded):
    """One padded forward's last-position logits are each prompt's own, within float32
    rounding, and choose the same greedy token (different computations: a GEMM over the
    padded rows against one prompt's)."""
    from mlx_lm.models.cache import make_prompt_cache

    from core.engine.generation import last_logits

    model = long_loaded.model
    if _hybrid(long_loaded):
        pytest.skip("hybrid models keep the one-at-a-time path")
    prompts = [long_loaded.tokenizer.encode(t) for t in PROMPTS]
    rows = batch_prefill.prefill_rows(
        model, [make_prompt_cache(model) for _ in prompts], [[] for _ in prompts], prompts
    )
    for i, p in enumerate(prompts):
        alone = last_logits(model, mx.array(p)[None], make_prompt_cache(model))
        np.testing.assert_allclose(
            np.array(rows.logits[i]), np.array(alone[0]), rtol=1e-4, atol=1e-4
        )
        assert mx.argmax(rows.logits[i]).item() == mx.argmax(alone[0]).item()
        kv = rows.caches(i)[0]
        assert kv.offset == len(p)


def test_requests_sent_together_are_prefilled_together(tiny_model, tmp_path, monkeypatch):
    """Through the engine: four requests submitted at once, their prompts still on the
    prompt threads when the first reaches the engine; it waits for the others (nobody
    decodes) and prefills all four in one forward, with the replies they get one by one."""
    from core.engine import engine as engine_module
    from core.engine.engine import Engine
    from core.engine.prompt_threads import PromptThreads

    monkeypatch.setattr(engine_module, "GATHER_S", 30.0)  # here: until all four are in
    submitted, go = threading.Event(), threading.Event()
    prepare = PromptThreads.prepare

    def held(self, handle, prompts):  # the first prompt goes on once all four are submitted,
        # the others on ``go``
        (submitted if handle.request.prompt_text == PROMPTS[0] else go).wait(30)
        prepare(self, handle, prompts)

    monkeypatch.setattr(PromptThreads, "prepare", held)
    eng = Engine(tmp_path / "data", str(tiny_model), config=EngineConfig(pool_tokens=8192)).start()
    try:
        eng.wait_ready()
        backbone = type(eng._loaded.model.model)
        calls: list[tuple[int, int]] = []
        original = backbone.__call__

        def counted(module, inputs, *args, **kwargs):
            calls.append(tuple(inputs.shape[:2]))
            return original(module, inputs, *args, **kwargs)

        monkeypatch.setattr(backbone, "__call__", counted)
        requests = [
            GenerationRequest(
                prompt_text=t, sampling=SamplingParams(temperature=0.0, max_tokens=12)
            )
            for t in PROMPTS
        ]
        handles = [eng.submit(r) for r in requests]
        submitted.set()
        time.sleep(0.3)  # the first is in the engine's hands meanwhile (not a timed assert)
        go.set()
        together = [list(h.events(timeout=60))[-1] for h in handles]
        prefills = [c for c in calls if c[1] > 1]
        assert len(prefills) == 1 and prefills[0][0] == 4, calls
        alone = [list(eng.submit(r).events(timeout=60))[-1] for r in requests]  # one at a time
    finally:
        eng.shutdown()
    assert [d.text for d in together] == [d.text for d in alone]
