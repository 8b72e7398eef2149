"""Embeddings on the engine thread: the loaded model's last hidden states, pooled, normalised.

What a vector is: the hidden states the model's output head reads (the output of its final
norm, before the vocabulary projection: ``core.mlx_lm_compat.hidden_states``), pooled
over the input's tokens as the model's files say (``core.models.load.pooling``: the mean
for a chat model, as llama.cpp's ``--pooling mean`` serves embeddings from any model; the
first or the last token where a dedicated embedding model says so), then scaled to length
1; ``dimensions`` keeps the first components and scales again (OpenAI's shortening).

How it runs: the inputs, sorted by length, go in groups of up to ``FORWARD_TOKENS``
padded tokens, one forward pass each, right-padded: every model here is causal, so a real
position never attends to the padding after it, and a row's states are the ones it gets
alone (within rounding: a batch may sum in another order; an input repeated in one request
is computed once, so its copies are equal to the bit). An input longer than ``CHUNK``
goes alone (two such rows never fit in ``FORWARD_TOKENS``), in
chunks over a KV cache (the model's own caches, in the pool's KV format), cut at the same
positions however the request is made up; so padding never sits inside a cache that is
carried to a next chunk (a sliding window or a recurrent state would keep it). A causal
model's first-token state depends on that token only, so a first-token ("cls") pooled
input runs its first token alone. The engine runs one forward at a time
(:func:`advance`) and its decode step between two, so a large request holds the running
streams up for one forward at a time, as a prefill chunk does.

The prefix cache: a vector pooled from the last token needs only the last position's
state, and a cached prefix's K/V gives exactly that (within the rounding a cached prefix
always differs by): such inputs go one at a time, each matched against the cache of its
namespace and committed to it, so inputs that share a long instruction prefix (as
Qwen3-Embedding's and e5-mistral's queries do) compute it once. The mean and the first
token need every position's state (the first token's alone, but that is one token), and
K/V do not give the states, so those inputs neither read nor write the cache. The disk
tier is not used for embeddings.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

import mlx.core as mx

from core.engine.commands import EmbedCommand
from core.engine.embedding_inputs import embedding_tokens
from core.engine.types import EmbeddingRequest, EmbeddingResult
from core.errors import ModelLoadError, OutOfMemoryError, UserError
from core.mlx_lm_compat import generation_stream, hidden_states
from core.models.load.pooling import pooling_of

log = logging.getLogger(__name__)

CHUNK = 512  # positions: a longer input goes in chunks over a KV cache, cut at multiples of this
# padded tokens in one forward pass (rows x the longest row's chunk); under 2 x CHUNK, so a
# row longer than a chunk goes alone
FORWARD_TOKENS = CHUNK


def advance(command: EmbedCommand, loaded, prefix_cache, prompts) -> bool:
    """Run ``command``'s next forward pass on the loaded model (``loaded``, its
    ``prefix_cache`` and ``prompts``; None: no model). True once it is answered (``result``
    or ``error`` set, then ``done``); False: the engine queues it again. A model loaded
    since the command began starts it over on the new model."""
    job = command.job
    try:
        if loaded is None or prompts is None:
            raise ModelLoadError("no model is loaded")
        if not isinstance(job, EmbeddingJob) or job.load != prompts.load:
            tokens = (
                command.tokens
                if command.load == prompts.load
                else embedding_tokens(prompts, command.request)
            )
            job = command.job = EmbeddingJob(loaded, prefix_cache, tokens, command.request)
            job.load = prompts.load
        if not job.step(loaded, prefix_cache):
            return False
        command.result = job.result()
    except UserError as exc:
        command.error = exc
    except MemoryError:
        command.error = OutOfMemoryError("out of memory: embed fewer or shorter inputs")
    except Exception as exc:  # a bug: logged in full, one line to the caller
        log.exception("embedding failed")
        command.error = RuntimeError(f"internal error: {exc}")
    if isinstance(job, EmbeddingJob):
        job.close(prefix_cache)
    command.job = None
    command.done.set()
    return True


@dataclass
class Group:
    """Inputs in one padded batch (or one input resuming from a cached prefix)."""

    rows: list[int]  # the inputs' indices
    ids: mx.array  # (rows, longest) token ids, right-padded
    lengths: mx.array  # (rows,) each row's real length
    caches: list
    start: int = 0  # the position ``ids`` starts at (a cached prefix's length)
    done: int = 0  # positions of ``ids`` fed so far
    pooled: mx.array | None = None  # (rows, hidden) float32: the sum, or the picked state
    prefix: object | None = None  # kvcache.prefix_cache.Prefix, matched and locked
    tokens: list[int] = field(default_factory=list)  # the whole input (a cached group's)


class EmbeddingJob:
    """One request's inputs on the engine thread, a forward pass per :meth:`step`."""

    def __init__(self, loaded, prefix_cache, tokens: list[list[int]], request: EmbeddingRequest):
        self.started = time.perf_counter()
        self.load = 0  # which model load it runs on (the engine's count)
        pooling = pooling_of(loaded.info.path, loaded.config)
        if pooling.refused:
            raise UserError(f"{loaded.info.name} cannot give embeddings here: {pooling.refused}")
        _hidden_states(loaded)  # refused here, before any work
        self.mode, self.request = pooling.mode, request
        self.tokens = tokens
        self.needed = [1 if self.mode == "cls" else len(t) for t in tokens]  # causal: see docs
        self.vectors: dict[int, mx.array] = {}
        self.cached_tokens = 0
        self.group: Group | None = None
        self.cached = (
            self.mode == "last"
            and request.use_cache
            and prefix_cache is not None
            and prefix_cache.enabled
        )
        # an input repeated in the request is computed once and every copy gets its vector
        # (rows of one batch may sum in another order: copies would differ in the last bits)
        first: dict[tuple[int, ...], int] = {}
        self.same = [first.setdefault(tuple(t), i) for i, t in enumerate(tokens)]
        distinct = [i for i, j in enumerate(self.same) if i == j]
        order = sorted(distinct, key=lambda i: self.needed[i])
        self.waiting: deque[list[int]] = (
            deque([i] for i in order) if self.cached else _packed(order, self.needed)
        )

    def step(self, loaded, prefix_cache) -> bool:
        """One forward pass of ``loaded`` (the job keeps no reference to the model between
        steps: a model switch lets it go); True once every input has its vector."""
        if self.group is None:
            if not self.waiting:
                return True
            self.group = self._start(self.waiting.popleft(), loaded.model, prefix_cache)
        group = self.group
        width = group.ids.shape[1]
        a = group.done
        b = min(width, (group.start + a) // CHUNK * CHUNK + CHUNK - group.start)
        with mx.stream(generation_stream):
            states = _hidden_states(loaded)(group.ids[:, a:b], cache=group.caches)
            states = states.astype(mx.float32)
            positions = mx.arange(a, b)[None, :]
            lengths = group.lengths[:, None]
            if self.mode == "mean":
                keep = positions < lengths
            else:  # the first or the last position (a cls group is one token wide)
                keep = positions == lengths - 1
            part = mx.where(keep[..., None], states, 0.0).sum(axis=1)
            group.pooled = part if group.pooled is None else group.pooled + part
        mx.eval(group.pooled, [c.state for c in group.caches])
        group.done = b
        if b < width:
            return False
        self._finish(group, prefix_cache)
        self.group = None
        return not self.waiting

    def _start(self, rows: list[int], model, prefix_cache) -> Group:
        prefix, start = None, 0
        if self.cached:  # one input, from its longest cached prefix
            tokens = self.tokens[rows[0]]
            prefix = prefix_cache.match(tokens, self.request.cache_namespace)
            start = prefix.length
            caches = prefix_cache.make_caches(prefix, room=len(tokens) - start + 1)
            self.cached_tokens += start
        else:
            caches = _fresh_caches(model, prefix_cache)
        needed = [self.needed[i] for i in rows]
        width = max(needed) - start
        padded = [self.tokens[i][start:n] for i, n in zip(rows, needed)]
        ids = mx.array([row + [0] * (width - len(row)) for row in padded], dtype=mx.int32)
        return Group(
            rows,
            ids,
            mx.array([n - start for n in needed]),
            caches,
            start=start,
            prefix=prefix,
            tokens=self.tokens[rows[0]] if prefix is not None else [],
        )

    def _finish(self, group: Group, prefix_cache) -> None:
        pooled = group.pooled
        if self.mode == "mean":
            pooled = pooled / group.lengths[:, None].astype(mx.float32)
        for index, row in enumerate(group.rows):
            self.vectors[row] = pooled[index]
        if group.prefix is not None:  # its K/V, for the next input that shares its prefix
            end = prefix_cache.snapshot(group.caches, len(group.tokens))
            prefix, group.prefix = group.prefix, None
            prefix_cache.commit(prefix, group.tokens, group.caches, [end] if end else [])

    def result(self) -> EmbeddingResult:
        """The vectors, scaled to length 1 (and cut to ``dimensions``, scaled again)."""
        vectors = mx.stack([self.vectors[i] for i in self.same])
        width = vectors.shape[1]
        wanted = self.request.dimensions
        if wanted is not None:
            if wanted > width:
                raise UserError(f"dimensions is {wanted}, but this model's embeddings have {width}")
            vectors = vectors[:, :wanted]
        norms = mx.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / mx.maximum(norms, 1e-12)
        return EmbeddingResult(
            vectors=tuple(tuple(row) for row in vectors.tolist()),
            token_counts=tuple(len(t) for t in self.tokens),
            cached_tokens=self.cached_tokens,
            pooling=self.mode,
            total_s=time.perf_counter() - self.started,
        )

    def close(self, prefix_cache) -> None:
        """Give back what the job holds (a matched prefix's lock), finished or not."""
        group, self.group = self.group, None
        if group is not None and group.prefix is not None and prefix_cache is not None:
            prefix_cache.release(group.prefix)


def _hidden_states(loaded):
    """The member of ``loaded``'s model that gives its final-norm states; UserError where
    its architecture has none."""
    body, why = hidden_states(loaded.model)
    if body is None:
        raise UserError(
            f"{loaded.info.name} cannot give embeddings: {why} ({loaded.info.model_type} in mlx-lm)"
        )
    return body


def _fresh_caches(model, prefix_cache) -> list:
    """Empty caches in the KV format a cached request has (so results agree with it)."""
    if prefix_cache is not None:
        return prefix_cache.fresh_caches()
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


def _packed(order: list[int], needed: list[int]) -> deque[list[int]]:
    """``order`` (inputs by length, shortest first) cut into groups of at most
    ``FORWARD_TOKENS`` padded tokens per forward (a group's rows x its longest chunk)."""
    groups: deque[list[int]] = deque()
    for index in order:
        if groups and (len(groups[-1]) + 1) * min(needed[index], CHUNK) <= FORWARD_TOKENS:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups
