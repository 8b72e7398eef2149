"""The scheduler's prefill: which waiting prompt goes next, one chunk of it per step (or
several waiting prompts in one padded forward), and its first token. :class:`Prefiller`,
a component the :class:`~core.engine.scheduler.Scheduler` holds (``scheduler.prefill``):
it hands each request, its first token taken, to the decode side (a :class:`Decoder`: the
scheduler) and each reply to the scheduler's :class:`~core.engine.replies.Finisher`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from core.engine import batch_prefill, generation
from core.engine.generation import ChunkedPrefill
from core.engine.pacing import ChunkPacer
from core.engine.replies import Finisher
from core.engine.running import Active, PrefillJob
from core.engine.turns import PrefillTurns, Turn
from core.engine.types import ErrorEvent, ProgressEvent
from core.errors import ErrorKind, UserError
from core.mlx_lm_compat import generation_stream

if TYPE_CHECKING:  # annotations only
    from kvcache.tiered import TieredCache

log = logging.getLogger(__name__)


class Decoder(Protocol):
    """What the prefill needs of the decode side (:class:`core.engine.scheduler.Scheduler`)."""

    @property
    def decoding(self) -> bool:
        """Whether any request decodes now."""
        ...

    def decoding_rows(self, client: str) -> int:
        """How many of ``client``'s requests decode now."""
        ...

    def start_decoding(self, job: PrefillJob, caches: list, first: int) -> None:
        """``job``'s prompt is in and ``first`` taken: it decodes from here (alone or in the
        batch)."""
        ...

    def join_rows(self, joining: list[tuple[int, PrefillJob, int]], rows) -> None:
        """The requests of a batched prefill that go on, as (row, job, first token): they
        decode from here, their rows' caches as ``rows`` (``core.engine.batch_prefill``)
        hold them."""
        ...


class Prefiller:
    """The requests admitted but not decoding yet (``waiting``): whose turn it is
    (``turns``), one chunk per :meth:`step` (sized by ``pacer``; None: a prompt whole), or
    several prompts in one padded forward (``batch_prefill``); the prompt matched against
    ``cache`` (None: caching is off) when its prefill starts."""

    def __init__(
        self,
        loaded,
        cache: TieredCache | None,
        replies: Finisher,
        decoder: Decoder,
        *,
        turns: PrefillTurns,
        pacer: ChunkPacer | None,
        batch_prefill: bool,
        on_progress: Callable[[], None],
        on_finished: Callable[[], None],
    ):
        self.loaded, self.cache, self.replies, self.decoder = loaded, cache, replies, decoder
        self.turns, self.pacer, self.batch_prefill = turns, pacer, batch_prefill
        self.on_progress = on_progress  # after each prefill chunk (live memory panels)
        self.on_finished = on_finished
        self.waiting: list[PrefillJob] = []
        self._arrivals = 0

    def check_room(self, client: str) -> None:
        """TooManyWaitingError where ``client`` has as many prompts waiting as it may."""
        self.turns.check_room(client, self.waiting)

    def queue(self, state: Active, sampler, processors: list, client: str, priority: int) -> None:
        """Queue a request the scheduler checked (:meth:`check_room` first) for its prefill."""
        self._arrivals += 1
        self.waiting.append(
            PrefillJob(state, sampler, processors, Turn(client, priority, self._arrivals))
        )

    def step(self) -> None:
        """End the waiting requests that were cancelled; then the waiting request whose turn
        it is (``core.engine.turns``) takes one chunk of prefill: a chunk sized by the pacer,
        the whole prompt when interleaving is off."""
        for job in [j for j in self.waiting if j.state.handle.cancelled]:
            self._end_prefill(job, "cancelled")
        if not self.waiting:
            return
        in_turn = self._in_turn()
        if self.batch_prefill and len(in_turn) > 1 and in_turn[0].run is None:
            group = self._batch_group(in_turn)
            if len(group) > 1:
                self._prefill_together(group)
                return
            if not self.waiting:
                return
            in_turn = self._in_turn()
        job = in_turn[0]
        self.turns.served(job.turn.client)
        try:
            if job.run is None:
                self._start_prefill(job)
            if self.pacer is None:  # the whole prompt now, cancel still checked between chunks
                self._chunk(job, 0)
                while not job.run.finished and not job.state.handle.cancelled:
                    self._chunk(job, 0)
            else:
                self._chunk(job, self.pacer.size(self.decoder.decoding))
            if job.state.handle.cancelled:
                self._end_prefill(job, "cancelled")
            elif job.run.finished:
                self.waiting.remove(job)
                self._first_token(job)
        except Exception as exc:  # this request fails; the others run on
            if job in self.waiting:
                self.waiting.remove(job)
            self._end_with_error(job, exc)

    def _in_turn(self) -> list[PrefillJob]:
        """The waiting prompts in turn (``core.engine.turns``). Without the round robin (for
        the side-by-side bench): by priority, then the client with the fewest requests
        decoding, then arrival, as before it."""
        if self.turns.round_robin:
            return self.turns.order(self.waiting)

        def before(job: PrefillJob) -> tuple[int, int, int]:
            decoding = self.decoder.decoding_rows(job.turn.client)
            return job.turn.priority, decoding, job.turn.arrival

        return sorted(self.waiting, key=before)

    def _batch_group(self, in_turn: list[PrefillJob]) -> list[PrefillJob]:
        """The waiting prompts that go together: the first of ``in_turn`` and those right
        behind it, while their padded rests fit the pacer's budget (all of them
        started: matched against the cache). One that does not fit stays started, for the
        one-at-a-time path."""
        decoding = self.decoder.decoding
        tokens = (
            self.pacer.batch_tokens(decoding, batch_prefill.IDLE_TOKENS)
            if self.pacer is not None
            else batch_prefill.IDLE_TOKENS
        )
        group: list[PrefillJob] = []
        rests: list[int] = []
        for job in in_turn[: batch_prefill.PREFILL_ROWS]:
            if job.run is not None and job.run.done:  # part-way through its chunks
                break
            try:
                if job.run is None:
                    self._start_prefill(job)
            except Exception as exc:
                self.waiting.remove(job)
                self._end_with_error(job, exc)
                continue
            rest = len(job.state.prompt) - job.state.cached
            if not batch_prefill.batchable(job.caches) or batch_prefill.rows_that_fit(
                [*rests, rest], tokens
            ) <= len(rests):
                break
            group.append(job)
            rests.append(rest)
        return group

    def _prefill_together(self, group: list[PrefillJob]) -> None:
        """Prefill ``group``'s prompts in one padded forward; each row takes its first
        token from its own logits, and they start decoding together."""
        if self.decoder.decoding:
            mx.synchronize(generation_stream)  # as _chunk: the queued decode step is not ours
        for job in group:
            self.waiting.remove(job)
            self.turns.served(job.turn.client)
        began = time.perf_counter()
        try:
            rows = batch_prefill.prefill_rows(
                self.loaded.model,
                [job.caches for job in group],
                [job.state.prompt[: job.state.cached] for job in group],
                [job.state.prompt[job.state.cached :] for job in group],
            )
        except Exception as exc:  # these requests fail; the others run on
            for job in group:
                self._end_with_error(job, exc)
            return
        seconds = time.perf_counter() - began
        if self.pacer is not None:
            self.pacer.observe(rows.padded_tokens, seconds)
        computed = sum(len(job.state.prompt) - job.state.cached for job in group)
        for job in group:
            job.compute_s += seconds * (len(job.state.prompt) - job.state.cached) / computed
            job.state.handle.emit(ProgressEvent(len(job.state.prompt), len(job.state.prompt)))
        self.on_progress()
        try:
            self._first_tokens(group, rows)
        finally:
            if any(job.flush for job in group):
                self.cache.flush_writes()

    def _first_tokens(self, group: list[PrefillJob], rows) -> None:
        """Each row of a batched prefill samples its first token; those not done join the
        decode batch together, their merged caches as they are (or, alone, decode solo)."""
        joining: list[tuple[int, PrefillJob, int]] = []  # (row, request, its first token)
        for row, job in enumerate(group):
            state = job.state
            try:
                if state.handle.cancelled:  # during the forward: its prompt is in, and kept
                    self.replies.finish(state, "cancelled", rows.caches(row), list(state.prompt))
                    continue
                first = self._sample_first(job, rows.logits[row : row + 1])
                finish = self.replies.take(state, first)
                if finish is not None:  # done after one token: the cache holds the prompt
                    self.replies.finish(state, finish, rows.caches(row), list(state.prompt))
                    continue
            except Exception as exc:
                self._end_with_error(job, exc)
                continue
            joining.append((row, job, first))
        if joining:
            self.decoder.join_rows(joining, rows)

    def _start_prefill(self, job: PrefillJob) -> None:
        """Match the prompt against the cache (RAM, then disk) and set up its prefill."""
        state, request = job.state, job.state.handle.request
        prompt = state.prompt
        cache = self.cache if self.cache is not None and request.use_cache else None
        prefix = (
            cache.match(prompt, request.cache_namespace, request.session)
            if cache is not None and cache.enabled
            else None
        )
        job.flush = bool(prefix and prefix.restored)  # restored K/V into the pool: after token 1
        state.prefix = prefix
        state.cached = prefix.length if prefix is not None else 0
        state.restored = prefix.restored if prefix is not None else 0
        job.caches = (
            self.cache.make_caches(prefix, room=len(prompt) - prefix.length + 1)
            if prefix is not None
            else self.cache.fresh_caches()
            if self.cache is not None  # the KV format cached requests have: same answers
            else make_prompt_cache(self.loaded.model)
        )
        cached, caches = state.cached, job.caches

        def on_prefilled(done: int) -> None:
            if done and (snap := self.cache.snapshot(caches, cached + done)):
                state.snapshots.append(snap)

        hybrid = prefix is not None and self.cache.hybrid
        job.run = ChunkedPrefill(
            self.loaded.model, prompt[cached:], caches, on_prefilled if hybrid else None
        )
        state.handle.emit(ProgressEvent(cached, len(prompt)))

    def _chunk(self, job: PrefillJob, size: int) -> None:
        """One chunk of ``job``'s prefill (``size`` 0: ``PREFILL_CHUNK``), timed. The decode
        step queued before it finishes first: the chunk would wait for it on the same stream
        anyway, and its time is not the chunk's (the pacer sizes chunks from their own rate)."""
        if self.decoder.decoding:
            mx.synchronize(generation_stream)
        began = time.perf_counter()
        tokens = job.run.advance(size or generation.PREFILL_CHUNK)
        seconds = time.perf_counter() - began
        job.compute_s += seconds
        if self.pacer is not None:
            self.pacer.observe(tokens, seconds)
        job.state.handle.emit(ProgressEvent(job.state.cached + job.run.done, len(job.state.prompt)))
        self.on_progress()

    def _first_token(self, job: PrefillJob) -> None:
        """The prompt is in: sample the first token, then decode alone or in the batch."""
        state, caches, prompt = job.state, job.caches, job.state.prompt
        try:
            first = self._sample_first(job, job.run.logits)
            finish = self.replies.take(state, first)
            if finish is not None:  # done after one token: the cache holds the prompt
                self.replies.finish(state, finish, caches, prompt)
                return
            self.decoder.start_decoding(job, caches, first)
        finally:
            if job.flush:
                self.cache.flush_writes()

    def _sample_first(self, job: PrefillJob, logits: mx.array) -> int:
        """The first token from the logits after the prompt (``(1, vocab)``)."""
        state, prompt = job.state, job.state.prompt
        if self.cache is not None:  # the rate a disk read must beat
            self.cache.observe_prefill(len(prompt) - state.cached, job.compute_s)
        seed = state.handle.request.sampling.seed
        if seed is not None:
            mx.random.seed(seed)
        history = mx.array(prompt)
        for processor in job.processors:
            logits = processor(history, logits)
        state.detok.reset()
        return job.sampler(logits - mx.logsumexp(logits, keepdims=True)).item()

    def _end_prefill(self, job: PrefillJob, finish: str) -> None:
        """A waiting or prefilling request ends before its first token (cancelled). The
        chunks its prefill finished are kept: each is evaluated whole before the next step
        checks cancel, so its caches hold exactly the prompt's first ``cached + done``
        tokens (a hybrid model's snapshot is taken there, as at a request's end)."""
        self.waiting.remove(job)
        held = job.state.prompt[: job.state.cached + job.run.done] if job.run is not None else None
        try:
            self.replies.finish_safely(job.state, finish, job.caches if held else None, held)
        finally:
            if job.flush:
                self.cache.flush_writes()

    def _end_with_error(self, job: PrefillJob, exc: Exception) -> None:
        state = job.state
        if isinstance(exc, UserError):
            event = ErrorEvent(str(exc), exc.kind)
        elif isinstance(exc, MemoryError):
            event = ErrorEvent(
                "out of memory: try a shorter prompt or a smaller model", ErrorKind.OUT_OF_MEMORY
            )
        else:
            log.exception("prefilling a request failed")
            event = ErrorEvent(f"internal error: {exc}", ErrorKind.INTERNAL)
        try:
            if state.prefix is not None:
                self.cache.release(state.prefix)
            if job.flush:
                self.cache.flush_writes()
        finally:
            state.handle.emit(event)
            state.handle.finish()
            self.on_finished()
