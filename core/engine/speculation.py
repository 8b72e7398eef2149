"""Checking a draft (``core.engine.drafts``) in one forward, so that speculation changes
nothing but the speed.

The model reads the last taken token and the draft in one call, which costs little more
than reading one token (a decode step is bound by reading the weights once). Its logits
after each position say what it would have written there:

- greedy: the longest start of the draft that agrees with the model's own choices is
  accepted, then the model's own next token: the reply is token for token the one decoding
  a token at a time writes.
- sampling: at each position a token is drawn from the model's distribution ``p`` there
  (the request's own sampler and logits processors), and the draft's token is accepted if
  the draw is that token; the first disagreement keeps the drawn token and ends the step.
  A draft is a deterministic proposal (``q`` is one-hot on its token ``d``), for which the
  standard speculative rule (accept ``d`` with probability ``min(1, p(d)/q(d)) = p(d)``,
  else draw from ``p`` with ``d`` removed, renormalised) is exactly this: ``d`` comes out
  with probability ``p(d)``, any other ``x`` with ``(1 - p(d)) p(x) / (1 - p(d)) = p(x)``.
  So every token has the distribution it has without speculation (mlx-lm's
  ``speculative_generate_step`` accepts the same way).

The caches took the whole draft; the rejected tail is trimmed off again (mlx-lm's
``trim``), so they hold exactly the accepted tokens. Only caches whose trim is exact take
drafts (:func:`can_speculate`): a sliding window that has wrapped or a recurrent state
cannot drop tokens, so speculation is off for such models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache
from mlx_lm.sample_utils import greedy_sampler

from core.mlx_lm_compat import generation_stream

TRIMMABLE = (KVCache, QuantizedKVCache)  # caches whose trim drops exactly the last tokens


@dataclass(frozen=True)
class Verdict:
    """What one verifying forward gave: the draft's accepted tokens, then the model's own."""

    accepted: list[int]
    next_token: int


def can_speculate(caches: list) -> bool:
    """Whether every cache can give back tokens it took (full attention, not hybrid)."""
    return bool(caches) and all(type(cache) in TRIMMABLE for cache in caches)


def trim(caches: list, n: int) -> None:
    """Drop the last ``n`` tokens from every cache."""
    if n:
        for cache in caches:
            cache.trim(n)


def verify(
    model,
    caches: list,
    last: int,
    draft: Sequence[int],
    sampler,
    processors: list,
    context: mx.array | None,
) -> Verdict:
    """Feed ``last`` (taken, not yet in ``caches``) and ``draft`` into ``caches``; accept
    what the model agrees with (module docstring) and trim the rest. ``context``: the
    tokens before ``last`` (for logits processors; None without them)."""
    inputs = [last, *draft]
    with mx.stream(generation_stream):
        logits = model(mx.array(inputs)[None], cache=caches)[0]
        if sampler is greedy_sampler and not processors:
            choices = mx.argmax(logits, axis=-1)
    if sampler is greedy_sampler and not processors:
        picked = choices.tolist()
        n = 0
        while n < len(draft) and picked[n] == draft[n]:
            n += 1
        trim(caches, len(draft) - n)
        return Verdict(list(draft[:n]), picked[n])
    fed = mx.array(inputs)

    def draw(n: int) -> int:  # the model's token after position n, as decoding draws it
        with mx.stream(generation_stream):
            row = logits[n : n + 1]
            if processors:
                history = (
                    fed[: n + 1] if context is None else mx.concatenate([context, fed[: n + 1]])
                )
                for processor in processors:
                    row = processor(history, row)
            return sampler(row - mx.logsumexp(row, keepdims=True)).item()

    n = 0
    token = draw(0)
    while n < len(draft) and token == draft[n]:
        n += 1
        token = draw(n)
    trim(caches, len(draft) - n)
    return Verdict(list(draft[:n]), token)
