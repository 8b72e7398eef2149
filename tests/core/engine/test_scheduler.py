"""The scheduler on this thread: a lone request decodes on its own caches, hands over to
the batch when a second one arrives, and either way gives the replies it gives alone;
the last-position logits of a prefill equal the full forward pass's."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from core.engine.generation import last_logits
from core.engine.types import ErrorEvent
from core.errors import ErrorKind
from tests.core.engine.helpers import done, finish, handle, no_locks, run_alone, scheduler, start
from tests.core.engine.token_log import TokenLog

PROMPTS = ("the first question is this one", "and a second, different prompt")


@pytest.mark.parametrize("sampling", [{}, {"repetition_penalty": 1.3}])
@pytest.mark.parametrize("steps_before", [0, 1, 5])
def test_hand_over_to_the_batch_keeps_replies(loaded, sampling, steps_before, monkeypatch):
    """Alone, then decoded in a batch of two: different computations (a batch's GEMM over
    two rows), so the replies are compared token by token. (Without speculation: a
    speculating request may be done before the second comes; test_speculation.py hands
    one over.)"""
    log = TokenLog(monkeypatch)
    s = scheduler(loaded, speculative="off")
    alone_handles = [handle(p, **sampling) for p in PROMPTS]
    alone = [run_alone(s, h) for h in alone_handles]
    assert s.solo is None and not s.batched
    first, second = (handle(p, **sampling) for p in PROMPTS)
    start(s, first)
    assert s.solo is not None  # alone: no batch
    for _ in range(steps_before):
        s.step()
    start(s, second)  # the first request joins the batch with the second
    assert s.solo is None and len(s.active) == 2
    finish(s)
    together = [done(first), done(second)]
    assert [log.of(h) for h in (first, second)] == [log.of(h) for h in alone_handles]
    assert [d.text for d in together] == [d.text for d in alone]
    assert [d.stats.completion_tokens for d in together] == [
        d.stats.completion_tokens for d in alone
    ]


@pytest.mark.parametrize("max_tokens", [1, 2, 3])
def test_solo_max_tokens_and_cache_contents(loaded, max_tokens):
    s = scheduler(loaded)
    reply = run_alone(s, handle(PROMPTS[0], max_tokens=max_tokens))
    assert reply.stats.completion_tokens == max_tokens and reply.stats.finish_reason == "length"
    again = run_alone(s, handle(PROMPTS[0], max_tokens=max_tokens + 4))
    assert again.text.startswith(reply.text)
    assert again.stats.cached_tokens == again.stats.prompt_tokens - 1  # the prompt came back


def test_cancel_while_solo(loaded):
    s = scheduler(loaded)
    h = handle(PROMPTS[0], max_tokens=50)
    start(s, h)
    s.step()
    h.cancel()
    finish(s)
    assert done(h).stats.finish_reason == "cancelled"


def test_a_failed_hand_over_ends_the_running_request_with_an_error(loaded, monkeypatch):
    s = scheduler(loaded)
    first, second = (handle(p) for p in PROMPTS)
    start(s, first)
    monkeypatch.setattr(
        s.batch, "join", lambda *a, **k: (_ for _ in ()).throw(MemoryError("no room"))
    )
    start(s, second)
    failed = list(second.events(timeout=0))  # the new request fails as before...
    assert isinstance(failed[-1], ErrorEvent) and failed[-1].kind is ErrorKind.OUT_OF_MEMORY
    events = list(first.events(timeout=0))  # ...and the running one ends instead of hanging
    assert isinstance(events[-1], ErrorEvent) and "no room" in events[-1].message
    assert s.solo is None and not s.batched
    assert no_locks(s)


def test_a_failure_caching_the_reply_still_sends_the_reply(loaded, monkeypatch):
    s = scheduler(loaded)
    expected = run_alone(s, handle(PROMPTS[0])).text
    s = scheduler(loaded)

    def broken(*args, **kwargs):
        raise RuntimeError("pool write failed")

    monkeypatch.setattr(s.cache.ram, "_store", broken)
    reply = run_alone(s, handle(PROMPTS[0]))
    assert reply.text == expected and no_locks(s)


def test_last_logits_equal_the_full_forward(loaded):
    model = loaded.model
    tokens = mx.array([[5, 17, 99, 3, 42, 8, 61]])
    a, b = make_prompt_cache(model), make_prompt_cache(model)
    full = model(tokens, cache=a)[:, -1, :]
    last = last_logits(model, tokens, b)
    assert last.shape == full.shape
    # different computations (the vocabulary projection of the last row alone against all
    # rows'): within float32 rounding, and the same greedy token
    assert mx.allclose(last, full, rtol=1e-5, atol=1e-5).item()
    assert mx.argmax(last).item() == mx.argmax(full).item()
    # the same computation (the same backbone forward over the same tokens): the same K/V
    states = [tree_flatten([c.state for c in cache]) for cache in (a, b)]
    assert all(mx.array_equal(p, q).item() for (_, p), (_, q) in zip(*states) if p is not None)
