"""The scheduler's prefill: which waiting prompt goes next, one chunk of it per step (or
several waiting prompts in one padded forward), and its first token (see
``core.engine.scheduler``, whose :class:`~core.engine.scheduler.Scheduler` this part is)."""

from __future__ import annotations

import logging
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from core.engine import batch_prefill, generation
from core.engine.generation import ChunkedPrefill
from core.engine.running import PrefillJob, group_of
from core.engine.types import ErrorEvent, ProgressEvent
from core.errors import ErrorKind, UserError
from core.mlx_lm_compat import generation_stream

log = logging.getLogger(__name__)


class PrefillSteps:
    """The prefill half of the scheduler (a part of :class:`core.engine.scheduler.Scheduler`,
    on its state: ``waiting``, ``solo``, ``batched``, ``pacer``, ``cache``...)."""

    def _prefill_step(self) -> None:
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
                self._chunk(job, self.pacer.size(self.solo is not None or bool(self.batched)))
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
            group = job.turn.client
            decoding = self.batch.rows_of(group) + (
                self.solo is not None and group_of(self.solo.state) == group
            )
            return job.turn.priority, decoding, job.turn.arrival

        return sorted(self.waiting, key=before)

    def _batch_group(self, in_turn: list[PrefillJob]) -> list[PrefillJob]:
        """The waiting prompts that go together: the first of ``in_turn`` and those right
        behind it, while their padded rests fit the pacer's budget (all of them
        started: matched against the cache). One that does not fit stays started, for the
        one-at-a-time path."""
        decoding = self.solo is not None or bool(self.batched)
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
        if self.solo is not None or self.batched:
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
                    self._finish(state, "cancelled", rows.caches(row), list(state.prompt))
                    continue
                first = self._sample_first(job, rows.logits[row : row + 1])
                finish = self._take(state, first)
                if finish is not None:  # done after one token: the cache holds the prompt
                    self._finish(state, finish, rows.caches(row), list(state.prompt))
                    continue
            except Exception as exc:
                self._end_with_error(job, exc)
                continue
            joining.append((row, job, first))
        if not joining:
            return
        try:
            if len(joining) == 1 and self.solo is None and not self.batched:
                row, job, first = joining[0]
                self._go_solo(job, rows.caches(row), first)
                return
            if self.solo is not None:
                self._hand_over()
            rows.keep([row for row, _, _ in joining])
            uids = self.batch.join_rows(
                [first for _, _, first in joining],
                rows.batch.prompt_cache,
                rows.batch.tokens,
                [job.sampler for _, job, _ in joining],
                [job.processors for _, job, _ in joining],
                [job.state.max_tokens - len(job.state.generated) for _, job, _ in joining],
                [group_of(job.state) for _, job, _ in joining],
            )
        except Exception as exc:
            log.exception("starting a batched prefill's requests failed")
            for _, job, _ in joining:
                self._fail(job.state, f"internal error: {exc}")
            return
        for uid, (_, job, _) in zip(uids, joining):
            self.batched[uid] = job.state

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
        if self.solo is not None or self.batched:
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
            finish = self._take(state, first)
            if finish is not None:  # done after one token: the cache holds the prompt
                self._finish(state, finish, caches, prompt)
                return
            if self.solo is None and not self.batched:
                self._go_solo(job, caches, first)
                return
            if self.solo is not None:
                self._hand_over()
            self._insert(state, first, caches, list(prompt), job.sampler, job.processors)
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
            self._finish_safely(job.state, finish, job.caches if held else None, held)
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
