"""The pieces of one request that run on the engine thread (see ``core.engine.scheduler``).

Chunked prefill advanced a chunk at a time, sampling through ``mlx_lm.sample_utils``,
and streaming text with stop strings held back until they can no longer match. The
prompt itself is rendered and tokenised off the engine thread (``core.engine.prompt``):
a request reaches the scheduler carrying its token ids.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from core.engine.types import SamplingParams
from core.mlx_lm_compat import backbone_and_head, generation_stream

PREFILL_CHUNK = 256  # tokens per prefill chunk when no other request decodes
# the last call takes the rest of the prompt when it is at most this fraction over the chunk
# size, rather than leaving a small tail for one more forward pass of its own
LAST_CHUNK_OVER = 0.25


class StopText:
    """Streams text, holding back any tail that could still become a stop string.

    Incremental: :meth:`feed` takes the reply's next piece, never the whole reply. Each
    stop string has a Knuth-Morris-Pratt matcher that takes the piece a character at a
    time and knows how long a start of its stop string the reply ends with; its failure
    table is built as far as a match has got, never further. So the work per token is
    bounded by the token's characters times the number of stop strings (amortised), however
    long the reply or the stop strings are; the held tail is the longest such start.
    """

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self._matchers = [_StopMatcher(stop) for stop in self.stops]
        self.pending = ""  # held back: a tail of the reply that is a start of a stop string
        self.hit = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, piece: str) -> tuple[str, bool]:
        """The next ``piece`` of the reply: the text now safe to show, and whether a stop
        string was hit (the text is cut before the earliest one; nothing is shown after)."""
        if self.hit:
            return "", True
        window = self.pending + piece
        if not self._matchers:
            self.pending = ""
            return window, False
        offset = len(self.pending)  # the matchers have seen the pending tail already
        earliest: tuple[int, str] | None = None
        for i, char in enumerate(piece, offset + 1):
            for matcher in self._matchers:
                if matcher.advance(char) and (
                    earliest is None or i - len(matcher.stop) < earliest[0]
                ):
                    earliest = (i - len(matcher.stop), matcher.stop)
        if earliest is not None:
            at, self.matched = earliest
            self.pending, self.hit = "", True
            return window[:at], True
        safe = len(window) - max(matcher.matched for matcher in self._matchers)
        self.pending = window[safe:]
        return window[:safe], False

    def finish(self, piece: str = "") -> str:
        """The last ``piece`` once no more comes, and what was held back, unless it
        completes a stop string."""
        out, hit = self.feed(piece)
        if hit:
            return out
        out, self.pending = out + self.pending, ""
        return out


class _StopMatcher:
    """One stop string's Knuth-Morris-Pratt matcher: ``matched`` is the length of the
    longest start of ``stop`` the text seen so far ends with. The failure table (the
    prefix function) grows as ``matched`` does, one entry per character matched."""

    def __init__(self, stop: str):
        self.stop = stop
        self.matched = 0
        self._fail = [0]  # _fail[i]: the longest proper border of stop[: i + 1]

    def advance(self, char: str) -> bool:
        """Take the next character; True when it completes the stop string."""
        stop, q = self.stop, self.matched
        while q and stop[q] != char:
            q = self._fail[q - 1]
        if stop[q] == char:
            q += 1
        if q == len(stop):  # the text is cut here: what comes after is never shown
            self.matched = 0
            return True
        self._extend(q)
        self.matched = q
        return False

    def _extend(self, upto: int) -> None:
        """Build the failure table up to index ``upto - 1`` (it is used for indices below
        ``matched``)."""
        fail, stop = self._fail, self.stop
        while len(fail) < upto:
            i, k = len(fail), fail[-1]
            while k and stop[i] != stop[k]:
                k = fail[k - 1]
            fail.append(k + 1 if stop[i] == stop[k] else k)


def vocab_size(model, config: dict) -> int | None:
    """How many token ids ``model`` can look up: its config's ``vocab_size``, else the rows
    of its first embedding table (None if it has neither)."""
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if size:
        return int(size)
    for _, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)):
            return int(module.weight.shape[0])
    return None


def sampling_tools(params: SamplingParams, vocab: int | None = None):
    """mlx-lm's sampler and logits processors for ``params``. A ``top_k`` that keeps the
    whole vocabulary (or more) is no filter at all."""
    top_k = 0 if vocab is not None and params.top_k >= vocab else params.top_k
    sampler = make_sampler(
        temp=params.temperature, top_p=params.top_p, min_p=params.min_p, top_k=top_k
    )
    processors = make_logits_processors(
        repetition_penalty=params.repetition_penalty if params.repetition_penalty != 1.0 else None
    )
    return sampler, processors


class ChunkedPrefill:
    """One prompt's prefill as a piece of scheduler state: each :meth:`advance` feeds the
    next chunk into ``cache``, so the engine can run other requests' decode steps between
    chunks (and check cancel there).

    Chunks of the prompt evaluate only the cache, so the vocabulary projection of those
    positions is never computed. The last call takes the rest of the prompt, its last
    position giving the logits (``logits``, ``(1, vocab)``, once ``finished``): a follow-up
    turn that fits in a chunk is one forward pass, and a rest a little over the chunk size
    (up to ``LAST_CHUNK_OVER`` of it) is not split into a chunk and a small tail, which
    would cost one more forward pass over the whole cache (mlx-lm's ``generate_step``
    feeds the last token apart, in a pass of its own).
    ``on_prefilled(n)``, if given, runs when all but the last token are in the cache: the
    engine snapshots hybrid state there, so the same prompt asked again (regenerate) can
    resume right before its last token (the last call is then that one token).
    """

    def __init__(
        self,
        model,
        tokens: list[int],
        cache: list,
        on_prefilled: Callable[[int], None] | None = None,
    ):
        self.model, self.tokens, self.cache = model, tokens, cache
        self.on_prefilled = on_prefilled
        self.tail_only = on_prefilled is not None  # the last call is the last token alone
        self.done = 0  # tokens in the cache
        self.logits: mx.array | None = None

    @property
    def finished(self) -> bool:
        return self.logits is not None

    def advance(self, size: int) -> int:
        """Feed the next chunk (at most ``size`` tokens; the last call, the rest, up to
        ``LAST_CHUNK_OVER`` more); returns how many tokens went in."""
        rest = len(self.tokens) - self.done
        size = max(1, size)
        last = 1 if self.tail_only else size + int(size * LAST_CHUNK_OVER)
        if rest > last:
            chunk = self.tokens[self.done : min(self.done + max(1, size), len(self.tokens) - 1)]
            with mx.stream(generation_stream):
                self.model(mx.array(chunk)[None], cache=self.cache)
            mx.eval([c.state for c in self.cache])
            self.done += len(chunk)
            return len(chunk)
        if self.on_prefilled is not None:
            self.on_prefilled(self.done)
        with mx.stream(generation_stream):
            logits = last_logits(self.model, mx.array(self.tokens[self.done :])[None], self.cache)
        mx.eval(logits, [c.state for c in self.cache])
        self.done, self.logits = len(self.tokens), logits
        return rest


def last_logits(model, inputs: mx.array, cache: list) -> mx.array:
    """The logits after the last of ``inputs`` (``(1, n)``), as ``(1, vocab)``.

    For the architectures whose forward is ``head(backbone(...))``
    (``core.mlx_lm_compat.backbone_and_head``), the vocabulary projection runs on the last
    position only: for a 27-token follow-up on SmolLM2 the projection is a fifth of the
    forward pass, and the other 26 rows of it are thrown away. (The row slicing the full
    projection gives, within float32 rounding: a row of a matrix product does not depend
    on the other rows, though a BLAS may sum one row in another order than a block of
    them.) Any other model runs whole.
    """
    return rows_logits(model, inputs, cache, [inputs.shape[1] - 1])


def rows_logits(model, inputs: mx.array, cache: list, last: list[int]) -> mx.array:
    """The logits after position ``last[i]`` of row ``i`` of ``inputs`` (``(B, n)``, rows
    right-padded past their ``last``), as ``(B, vocab)``; the vocabulary projection on
    those positions only where :func:`last_logits` can."""
    split = backbone_and_head(model)
    rows = mx.arange(len(last))
    at = mx.array(last)
    if split is None:
        return model(inputs, cache=cache)[rows, at, :]
    backbone, head = split
    hidden = backbone(inputs, cache)
    if len(last) == 1:  # one row: a slice, as before
        return head(hidden[:, last[0] : last[0] + 1, :])[:, -1, :]
    return head(hidden[rows, at, :])
