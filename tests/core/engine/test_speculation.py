"""Speculative decoding changes nothing but the speed (core/engine/speculation.py and the
scheduler's speculative step): greedy replies token for token, sampled tokens with their
distribution, stop strings and max tokens as before, and the cache holding exactly the
accepted tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler, make_sampler

from core.engine.speculation import can_speculate, verify
from core.engine.types import GenerationRequest, SamplingParams
from kvcache.continuations import Continuations
from tests.core.engine.helpers import done, finish, handle, load_tiny, run_alone, scheduler, start
from tests.core.engine.token_log import TokenLog

# a prompt whose greedy reply on the tiny models repeats itself (drafts get taken)
LOOPING = "abcabcabcabc xyz abcabcabcabc xyz abcabc"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load_tiny(tmp_path_factory, "llama", num_layers=2, max_position_embeddings=2048)


def greedy_alone(model, prompt: list[int], n: int) -> list[int]:
    caches = make_prompt_cache(model)
    logits = model(mx.array(prompt)[None], cache=caches)[0, -1]
    out = []
    for _ in range(n):
        out.append(mx.argmax(logits).item())
        logits = model(mx.array(out[-1:])[None], cache=caches)[0, -1]
    return out


def test_greedy_verify_takes_the_agreeing_start_and_the_models_own_token(llama):
    model = llama.model
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    truth = greedy_alone(model, prompt, 6)
    caches = make_prompt_cache(model)
    model(mx.array(prompt[:-1])[None], cache=caches)
    wrong = (truth[3] + 1) % 200
    verdict = verify(model, caches, prompt[-1], [*truth[:3], wrong, 7], greedy_sampler, [], None)
    assert verdict.accepted == truth[:3]
    assert verdict.next_token == truth[3]
    assert caches[0].offset == len(prompt) + 3  # the prompt, three accepted: the rest trimmed
    whole = verify(model, caches, truth[3], truth[4:6], greedy_sampler, [], None)
    assert whole.accepted == truth[4:6]
    assert whole.next_token == greedy_alone(model, prompt, 7)[6]


class FixedLogits:
    """A "model" whose logits at each position of a call are given (the draft's checks
    read them); it writes nothing into its caches but their offsets."""

    def __init__(self, rows: list[list[float]]):
        self.logits = mx.array(rows)[None]

    def __call__(self, inputs, cache):
        for c in cache:
            c.offset += inputs.shape[1]
        return self.logits[:, : inputs.shape[1]]


def test_sampled_tokens_keep_their_distribution():
    """Sampling with a draft: the first token is distributed as p0 whatever the draft, and
    the second (after the draft's first was taken) as p1. Fixed seed; total variation
    far below what a wrong rule gives (accepting the draft outright moves 0.5 of p0)."""
    p0 = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    p1 = np.array([0.1, 0.1, 0.3, 0.4, 0.1])
    model = FixedLogits([np.log(p0).tolist(), np.log(p1).tolist(), [0.0] * 5])
    sampler = make_sampler(temp=1.0)
    mx.random.seed(7)
    draft = [2, 3]  # p0(2) = 0.15: mostly rejected
    first, second = [], []
    for _ in range(4000):
        cache = KVCache()
        verdict = verify(model, [cache], 0, draft, sampler, [], None)
        tokens = [*verdict.accepted, verdict.next_token]
        first.append(tokens[0])
        if tokens[0] == draft[0]:
            second.append(tokens[1])
        assert cache.offset == 1 + len(verdict.accepted)
    tv_first = 0.5 * np.abs(np.bincount(first, minlength=5) / len(first) - p0).sum()
    tv_second = 0.5 * np.abs(np.bincount(second, minlength=5) / len(second) - p1).sum()
    assert len(second) > 400
    assert tv_first < 0.04
    assert tv_second < 0.08


def test_only_caches_that_trim_exactly_take_drafts(tmp_path_factory, llama):
    assert can_speculate(make_prompt_cache(llama.model))
    for kind in ("sliding", "recurrent"):
        hybrid = load_tiny(tmp_path_factory, kind, num_layers=4)
        assert not can_speculate(make_prompt_cache(hybrid.model))


def test_greedy_reply_is_token_for_token_the_one_without_speculation(llama, monkeypatch):
    log = TokenLog(monkeypatch)
    off = scheduler(llama, speculative="off")
    on = scheduler(llama)
    h_off, h_on = handle(LOOPING, max_tokens=80), handle(LOOPING, max_tokens=80)
    done_off, done_on = run_alone(off, h_off), run_alone(on, h_on)
    assert log.of(h_on) == log.of(h_off)
    assert done_on.text == done_off.text
    assert done_off.stats.draft_tokens == 0
    assert done_on.stats.accepted_tokens > 0  # the speculative path ran and was taken
    assert done_on.stats.completion_tokens == done_off.stats.completion_tokens == 80
    assert done_on.stats.tokens_per_step > 1.0


def test_stop_strings_end_a_speculative_reply_where_they_end_a_plain_one(llama, monkeypatch):
    log = TokenLog(monkeypatch)
    plain = run_alone(scheduler(llama, speculative="off"), handle(LOOPING, max_tokens=60))
    stop = plain.text[25:28]  # a piece in the middle of the reply
    h_off, h_on = handle(LOOPING, 60, stop=(stop,)), handle(LOOPING, 60, stop=(stop,))
    done_off = run_alone(scheduler(llama, speculative="off"), h_off)
    done_on = run_alone(scheduler(llama), h_on)
    assert done_on.text == done_off.text
    assert done_on.stats.finish_reason == done_off.stats.finish_reason == "stop"
    assert log.of(h_on) == log.of(h_off)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 7, 33])
def test_max_tokens_holds(llama, max_tokens):
    done = run_alone(scheduler(llama), handle(LOOPING, max_tokens=max_tokens))
    assert done.stats.completion_tokens == max_tokens
    assert done.stats.finish_reason == "length"


def test_the_cache_holds_exactly_the_accepted_tokens(llama):
    s = scheduler(llama)
    h = handle(LOOPING, max_tokens=50)
    done = run_alone(s, h)
    assert done.stats.accepted_tokens > 0
    prompt = list(llama.tokenizer.encode(LOOPING))
    tokens = [*s.cache.ram.tree.root.children.values()]
    assert len(tokens) == 1
    held = list(tokens[0].key)
    assert held[: len(prompt)] == prompt
    assert len(held) >= len(prompt) + done.stats.completion_tokens - 1
    # the K/V stored are those of a fresh forward over the same tokens (no rejected draft
    # token left anywhere in them)
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


def test_a_request_may_turn_speculation_off(llama):
    s = scheduler(llama)
    params = SamplingParams(temperature=0.0, max_tokens=40)
    h = type(handle("x"))(
        GenerationRequest(prompt_text=LOOPING, sampling=params, speculative="off")
    )
    assert run_alone(s, h).stats.draft_tokens == 0


def test_sampling_with_speculation_runs_to_its_length(llama):
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=60)
    h = type(handle("x"))(GenerationRequest(prompt_text=LOOPING, sampling=params))
    done = run_alone(scheduler(llama), h)
    assert done.stats.completion_tokens == 60
    assert done.stats.draft_tokens > 0  # the sampled drafts were checked


def test_repetition_penalty_greedy_is_unchanged(llama, monkeypatch):
    log = TokenLog(monkeypatch)
    h_off = handle(LOOPING, 60, repetition_penalty=1.05)
    h_on = handle(LOOPING, 60, repetition_penalty=1.05)
    run_alone(scheduler(llama, speculative="off"), h_off)
    run_alone(scheduler(llama), h_on)
    assert log.of(h_on) == log.of(h_off)


def test_hybrid_models_do_not_speculate(loaded):
    done = run_alone(scheduler(loaded), handle(LOOPING, max_tokens=30))
    if not can_speculate(make_prompt_cache(loaded.model)):  # sliding window, recurrent
        assert done.stats.draft_tokens == 0
    assert done.stats.completion_tokens == 30


def test_tree_drafts_read_the_requests_namespace_only(llama, monkeypatch):
    asked: list[str] = []
    follow = Continuations.follow

    def recording(self, context, limit, namespace=""):
        asked.append(namespace)
        return follow(self, context, limit, namespace)

    monkeypatch.setattr(Continuations, "follow", recording)
    s = scheduler(llama)
    params = SamplingParams(temperature=0.0, max_tokens=30)
    for namespace in ("key:alice", "key:bob"):
        request = GenerationRequest(
            prompt_text="qrstuvw 12345 qrstuvw", sampling=params, cache_namespace=namespace
        )
        asked.clear()
        run_alone(s, type(handle("x"))(request))
        assert asked
        assert set(asked) == {namespace}


def test_a_speculating_request_hands_over_to_the_batch(llama, monkeypatch):
    """Alone and speculating, then in a batch of two (where rows decode a token a step):
    the replies are those each gives alone."""
    log = TokenLog(monkeypatch)
    s = scheduler(llama)
    other = "qrstuvw 12345 qrstuvw 678"
    alone = [handle(LOOPING, max_tokens=300), handle(other, max_tokens=40)]
    for h in alone:
        run_alone(s, h)
    first, second = handle(LOOPING, max_tokens=300), handle(other, max_tokens=40)
    start(s, first)
    s.step()
    s.step()
    assert s.solo is not None and first.request is s.solo.state.handle.request
    start(s, second)
    assert s.solo is None and len(s.active) == 2
    finish(s)
    assert [log.of(h) for h in (first, second)] == [log.of(h) for h in alone]
    assert done(first).stats.accepted_tokens > 0
