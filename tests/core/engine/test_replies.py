"""A request's end keeps what its caches hold (core/engine/replies.py), a cancelled one's
too: a client that timed out and sends the same prompt again reads back what was computed
(the prompt once prefilled, the reply so far, the chunks of a prefill cut short), in its
own namespace only, never a token whose K/V was not computed nor a rejected draft token;
the retry's greedy reply is token for token the one an uncached request gives."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from core.engine import generation
from core.engine.drafts import Drafter
from core.engine.engine import RequestHandle
from core.engine.generation import ChunkedPrefill
from core.engine.namespaces import for_key
from core.engine.types import GenerationRequest, SamplingParams
from tests.core.engine import helpers
from tests.core.engine.helpers import (
    done,
    finish,
    handle,
    load_tiny,
    no_locks,
    run_alone,
    scheduler,
    start,
)
from tests.core.engine.test_speculation import LOOPING
from tests.core.engine.token_log import TokenLog

# an agent's long prompt (~120 tokens on the tiny models), sent again after a timeout
PROMPT = "You are a coding agent. Read the repository, then fix the failing test. " * 2


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load_tiny(tmp_path_factory, "llama", num_layers=2)


def cancel_after(s, h: RequestHandle, steps: int):
    """Start ``h``, decode ``steps`` steps, cancel it; its DoneEvent."""
    start(s, h)
    for _ in range(steps):
        s.step()
    h.cancel()
    finish(s)
    return done(h)


def prompt_of(s, text: str) -> list[int]:
    return list(s.loaded.tokenizer.encode(text))


def test_a_request_cancelled_after_its_prefill_leaves_its_prompt_and_reply(loaded, monkeypatch):
    log = TokenLog(monkeypatch)
    s = scheduler(loaded)
    cut = handle(PROMPT, max_tokens=200)
    stats = cancel_after(s, cut, 3).stats
    assert stats.finish_reason == "cancelled" and 0 < stats.completion_tokens < 200
    assert no_locks(s)
    prompt = prompt_of(s, PROMPT)
    # the prompt and the reply's tokens fed back into the caches (all but the last taken)
    assert s.cache.ram.cached_length(prompt + log.of(cut)) >= len(prompt) + len(log.of(cut)) - 1
    retry = handle(PROMPT, max_tokens=20)
    again = run_alone(s, retry).stats
    assert again.cached_tokens == again.prompt_tokens - 1 == len(prompt) - 1
    uncached = handle(PROMPT, max_tokens=20)
    run_alone(scheduler(loaded), uncached)
    assert log.of(retry) == log.of(uncached)


def test_a_cancel_mid_prefill_keeps_the_chunks_done(loaded, monkeypatch):
    monkeypatch.setattr(generation, "PREFILL_CHUNK", 16)
    log = TokenLog(monkeypatch)
    s = scheduler(loaded, interleave=False)  # the whole prompt in one step, cancel between chunks
    cut = handle(PROMPT, max_tokens=20)
    chunks: list[int] = []
    advance = ChunkedPrefill.advance

    def advance_then_cancel(run, size):
        chunks.append(advance(run, size))
        if len(chunks) == 2:
            cut.cancel()
        return chunks[-1]

    monkeypatch.setattr(ChunkedPrefill, "advance", advance_then_cancel)
    helpers.admit(s, cut)
    finish(s)
    monkeypatch.setattr(ChunkedPrefill, "advance", advance)
    stats = done(cut).stats
    assert stats.finish_reason == "cancelled" and stats.completion_tokens == 0
    assert chunks == [16, 16] and no_locks(s)
    retry = handle(PROMPT, max_tokens=20)
    again = run_alone(s, retry).stats
    assert again.cached_tokens == 32  # the two chunks done, no more
    uncached = handle(PROMPT, max_tokens=20)
    run_alone(scheduler(loaded), uncached)
    assert log.of(retry) == log.of(uncached)


def test_a_row_cancelled_in_the_decode_batch_leaves_its_prompt_and_reply(loaded, monkeypatch):
    log = TokenLog(monkeypatch)
    s = scheduler(loaded)
    cut, other = handle(PROMPT, max_tokens=200), handle("another client's prompt", 30)
    start(s, cut)
    start(s, other)  # the two decode in the batch
    for _ in range(3):
        s.step()
    assert len(s.batched) == 2
    cut.cancel()
    finish(s)
    assert done(cut).stats.finish_reason == "cancelled" and no_locks(s)
    prompt = prompt_of(s, PROMPT)
    assert s.cache.ram.cached_length(prompt + log.of(cut)) >= len(prompt) + len(log.of(cut)) - 1
    retry = handle(PROMPT, max_tokens=20)
    assert run_alone(s, retry).stats.cached_tokens == len(prompt) - 1
    uncached = handle(PROMPT, max_tokens=20)
    run_alone(scheduler(loaded), uncached)
    assert log.of(retry) == log.of(uncached)


def test_a_request_cancelled_before_its_prefill_leaves_nothing(loaded):
    s = scheduler(loaded)
    waiting = handle(PROMPT)
    helpers.admit(s, waiting)
    waiting.cancel()
    finish(s)
    assert done(waiting).stats.finish_reason == "cancelled"
    assert s.cache.ram.cached_length(prompt_of(s, PROMPT)) == 0 and no_locks(s)


def keyed(key: str, max_tokens: int) -> RequestHandle:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return RequestHandle(
        GenerationRequest(prompt_text=PROMPT, sampling=params, cache_namespace=for_key(key))
    )


def test_a_cancelled_request_caches_in_its_namespace_only(loaded):
    s = scheduler(loaded)
    cancel_after(s, keyed("alice", 200), 2)
    prompt = prompt_of(s, PROMPT)
    assert s.cache.ram.cached_length(prompt, for_key("alice")) >= len(prompt) - 1
    assert s.cache.ram.cached_length(prompt, for_key("bob")) == 0
    assert s.cache.ram.cached_length(prompt) == 0
    assert run_alone(s, keyed("bob", 4)).stats.cached_tokens == 0
    alice = run_alone(s, keyed("alice", 4)).stats
    assert alice.cached_tokens == alice.prompt_tokens - 1


def test_a_cancel_while_speculating_keeps_no_rejected_draft(llama, monkeypatch):
    """Each draft: the next two tokens of the greedy reply, then a wrong one (rejected,
    trimmed off the caches); cancelled a few steps in."""
    log = TokenLog(monkeypatch)
    reference = handle(LOOPING, max_tokens=60)
    run_alone(scheduler(llama, speculative="off"), reference)
    truth = log.of(reference)
    s = scheduler(llama)
    prompt = prompt_of(s, LOOPING)

    def right_then_wrong(drafter, limit: int) -> list[int]:
        n = len(drafter.tokens) - len(prompt)  # reply tokens taken so far
        return [*truth[n : n + 2], (truth[n + 2] + 1) % s.vocab][:limit]

    monkeypatch.setattr(Drafter, "propose", right_then_wrong)
    monkeypatch.setattr(Drafter, "worth_a_look", lambda drafter: True)
    cut = handle(LOOPING, max_tokens=60)
    stats = cancel_after(s, cut, 4).stats
    assert stats.finish_reason == "cancelled" and stats.completion_tokens < 60
    assert stats.draft_tokens == 3 * 4 and stats.accepted_tokens == 2 * 4  # one rejected a step
    assert log.of(cut) == truth[: len(log.of(cut))]
    (node,) = s.cache.ram.tree.root.children.values()
    held = list(node.key)
    assert held == (prompt + log.of(cut))[: len(held)]
    assert len(held) >= len(prompt) + len(log.of(cut)) - 1
    # the K/V stored are those of a fresh forward over the same tokens (no rejected draft
    # token in them)
    fresh = make_prompt_cache(llama.model)
    llama.model(mx.array(held)[None], cache=fresh)
    for (keys, values), layer in zip(s.cache.ram.cached_kv(held), fresh):
        assert keys.shape[-2] == len(held)
        np.testing.assert_allclose(
            np.array(keys), np.array(layer.keys[0, ..., : len(held), :]), rtol=1e-4, atol=1e-5
        )
        np.testing.assert_allclose(
            np.array(values), np.array(layer.values[0, ..., : len(held), :]), rtol=1e-4, atol=1e-5
        )
