"""Requests on the engine thread: prefill a chunk at a time, decode together in one batch.

A new request is rendered and checked, then waits its turn (by priority, then the client
with the fewest requests decoding, then arrival: the chat window's turns before API
requests, see ``core.engine.types.CHAT_PRIORITY``, and a client's next prompts after
another client's first; a client is its cache namespace less any salt).
Its prefill is state the scheduler advances one chunk per step: each step first gives
every decoding request its next token, then feeds one chunk of the first waiting prompt,
sized by ``core.engine.pacing`` so the decoding streams wait at most ``DECODE_WAIT_S``
for it. A prompt is matched against the prefix cache (RAM, then disk) when its prefill
starts, is cancellable between chunks, and snapshots hybrid state right before its last
prompt token; the first token is sampled from its prefill's logits. A request that runs
alone then decodes on its own cache objects the way ``mlx_lm.generate_step`` does (one
sequence, the next step queued before the current token is read), with nothing to merge,
mask or extract. When a second request gets its first token, the running one hands its
cache over to the decode batch (``core.engine.decode_batch``, over mlx-lm's
``GenerationBatch``), which takes per-request prompt caches and decodes every running
request in one forward pass per step; a request joins it with its first token as its next
input, so joining costs the others no forward pass of its own. The batch shares its rows
fairly between clients (it parks a row of a client over its share for a client under it). When a
request ends (EOS, stop string, max tokens, cancel) it leaves with its cache, which goes into
the radix tree and, for sessions, to disk.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

from core.engine import batch_prefill, generation, generic_tools
from core.engine.constrain import Grammars, tool_markup
from core.engine.decode_batch import DecodeBatch
from core.engine.generation import (
    ChunkedPrefill,
    StopText,
    render_prompt,
    sampling_tools,
    vocab_size,
)
from core.engine.namespaces import label as namespace_label
from core.engine.namespaces import owner as namespace_owner
from core.engine.pacing import ChunkPacer
from core.engine.tools import ToolCallText
from core.engine.types import (
    DoneEvent,
    ErrorEvent,
    ProgressEvent,
    RequestStats,
    TokenEvent,
    ToolCallEvent,
)
from core.errors import ContextLengthError, ErrorKind, UserError
from core.mlx_lm_compat import generation_stream

MAX_BATCH = 16  # requests decoded together

log = logging.getLogger(__name__)


@dataclass
class _Active:
    """One running request (engine thread only)."""

    handle: object  # core.engine.engine.RequestHandle
    prompt: list[int]
    prefix: object | None  # kvcache.prefix_cache.Prefix
    cached: int
    restored: int
    started: float
    max_tokens: int
    stop_text: StopText
    detok: object
    tool_text: ToolCallText | None = None  # takes tool-call markup out of the text
    grammar: object | None = None  # core.engine.constrain.GrammarProcessor, if constrained
    first_token_at: float | None = None
    generated: list[int] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)
    snapshots: list = field(default_factory=list)


@dataclass
class _Solo:
    """The one request decoding outside the batch, as ``mlx_lm.generate_step`` would."""

    state: _Active
    caches: list
    sampler: object
    processors: list
    cache_tokens: list[int]  # what ``caches`` hold
    pending: mx.array  # the next token: sampled, maybe still being computed, not yet taken
    context: mx.array | None  # prompt + generated, for logits processors


@dataclass
class _Prefill:
    """A request admitted but not yet decoding: waiting for its turn, or prefilling a chunk
    per scheduler step (engine thread only)."""

    state: _Active
    sampler: object
    processors: list
    order: tuple[int, int]  # (priority, arrival): the least goes first
    run: ChunkedPrefill | None = None  # once started
    caches: list | None = None
    compute_s: float = 0.0  # time spent in its chunks (not in others' decode steps between them)
    flush: bool = False  # restored from disk: flush the pool writes once it has its first token


def _group(state: _Active) -> str:
    """The client a request is from, for its fair share: its cache namespace less any salt."""
    return namespace_owner(state.handle.request.cache_namespace)


class Scheduler:
    """Admits requests and steps the shared decode batch of one loaded model."""

    def __init__(
        self,
        loaded,
        prefix_cache,
        persister,
        on_finished=lambda: None,
        on_progress=lambda: None,
        pacer: ChunkPacer | None = None,
        interleave: bool = True,
        batch_prefill: bool = True,
    ):
        self.loaded = loaded
        # Prompts that wait together prefilled in one padded forward (core.engine.batch_prefill)
        self.batch_prefill = batch_prefill
        # Sizes prefill chunks while others decode; None (interleave off): a prompt is
        # prefilled whole in the step that starts it, as before interleaving.
        self.pacer = (pacer or ChunkPacer()) if interleave else None
        self.on_finished = on_finished
        self.on_progress = on_progress  # after each prefill chunk (live memory panels)
        self.prefix_cache = prefix_cache
        self.persister = persister
        self.eos = set(loaded.tokenizer.eos_token_ids)
        self.vocab = vocab_size(loaded.model, loaded.config)
        # the template's tool-call markup, or the generic format where it has none
        self.markup = (
            generic_tools.MARKUP
            if generic_tools.applies(loaded.tokenizer)
            else tool_markup(loaded.tokenizer)
        )
        self.grammars = Grammars(loaded.tokenizer, self.vocab or len(loaded.tokenizer.get_vocab()))
        self.batch = DecodeBatch(loaded.model, MAX_BATCH)
        self.batched: dict[int, _Active] = {}  # batch uid -> request
        self.solo: _Solo | None = None
        self.waiting: list[_Prefill] = []  # admitted, not yet decoding
        self._arrivals = 0

    @property
    def active(self) -> list[_Active]:
        """Every decoding request."""
        return list(self.batched.values()) + ([self.solo.state] if self.solo is not None else [])

    @property
    def running(self) -> int:
        """Requests admitted and not yet finished: decoding, prefilling or waiting to."""
        return len(self.batched) + (self.solo is not None) + len(self.waiting)

    @property
    def busy(self) -> bool:
        return bool(self.batched) or self.solo is not None or bool(self.waiting)

    # ------------------------------------------------------------------ step
    def step(self) -> None:
        """One decode step for every decoding request, then one chunk of prefill for the
        first waiting request: a long prompt goes in between the others' tokens."""
        if self.solo is not None or self.batched:
            self._decode_step()
        if self.waiting:
            self._prefill_step()

    # ------------------------------------------------------------------ admit
    def admit(self, handle) -> None:
        """Check ``handle``'s request and queue it for prefill (:meth:`step` runs it, a chunk
        at a time). Raises UserError for a request that cannot run."""
        request, loaded = handle.request, self.loaded
        started = time.perf_counter() - handle.prompt_s  # rendered and tokenised on a prompt thread
        # schemas checked on the prompt thread (engine.py)
        prompt = render_prompt(loaded.tokenizer, request)
        context = loaded.info.context_length
        if self.vocab is not None and not 0 <= min(prompt) <= max(prompt) < self.vocab:
            bad = next(t for t in prompt if not 0 <= t < self.vocab)
            raise UserError(
                f"token id {bad} is not in {loaded.info.name}'s vocabulary "
                f"(ids 0 to {self.vocab - 1})"
            )
        if len(prompt) >= context:
            raise ContextLengthError(
                f"the prompt is {len(prompt)} tokens but {loaded.info.name} has a context of "
                f"{context}"
            )
        params = request.sampling
        # before prefill: a bad one fails at once
        grammar = generic_tools.grammar_for(request, self.markup)
        sampler, processors = sampling_tools(params, self.vocab)
        if grammar is not None:
            grammar = self.grammars.processor(grammar, len(prompt))
            processors = [*processors, grammar]
        calls_on = request.tools and request.tool_choice != "none"
        state = _Active(
            handle,
            prompt,
            None,
            0,
            0,
            started,
            min(params.max_tokens, context - len(prompt)),
            StopText(params.stop),
            loaded.tokenizer.detokenizer,
            ToolCallText(self.markup, request.tools) if calls_on else None,
            grammar,
        )
        self._arrivals += 1
        self.waiting.append(
            _Prefill(state, sampler, processors, (request.priority, self._arrivals))
        )

    def _prefill_step(self) -> None:
        """End the waiting requests that were cancelled; then the first waiting request (by
        priority, then arrival) takes one chunk of prefill: a chunk sized by the pacer while
        others decode, the whole prompt when interleaving is off."""
        for job in [j for j in self.waiting if j.state.handle.cancelled]:
            self._end_prefill(job, "cancelled")
        if not self.waiting:
            return
        if (
            self.batch_prefill
            and len(self.waiting) > 1
            and min(self.waiting, key=self._turn).run is None
        ):
            group = self._batch_group()
            if len(group) > 1:
                self._prefill_together(group)
                return
            if not self.waiting:
                return
        job = min(self.waiting, key=self._turn)
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

    def _turn(self, job: _Prefill) -> tuple[int, int, int]:
        """Which waiting prompt goes first: by priority, then the client with the fewest
        requests decoding (round robin between clients: one with 16 streams running does not
        keep another's first request waiting behind its next ones), then arrival."""
        group = _group(job.state)
        decoding = self.batch.rows_of(group) + (
            self.solo is not None and _group(self.solo.state) == group
        )
        priority, arrival = job.order
        return priority, decoding, arrival

    def _batch_group(self) -> list[_Prefill]:
        """The waiting prompts that go together, in turn: the first waiting one and those
        right behind it, while their padded rests fit the pacer's budget (all of them
        started: matched against the cache). One that does not fit stays started, for the
        one-at-a-time path."""
        decoding = self.solo is not None or bool(self.batched)
        tokens = (
            self.pacer.batch_tokens(decoding, batch_prefill.IDLE_TOKENS)
            if self.pacer is not None
            else batch_prefill.IDLE_TOKENS
        )
        group: list[_Prefill] = []
        rests: list[int] = []
        for job in sorted(self.waiting, key=self._turn)[: batch_prefill.PREFILL_ROWS]:
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

    def _prefill_together(self, group: list[_Prefill]) -> None:
        """Prefill ``group``'s prompts in one padded forward; each row takes its first
        token from its own logits, and they start decoding together."""
        if self.solo is not None or self.batched:
            mx.synchronize(generation_stream)  # as _chunk: the queued decode step is not ours
        for job in group:
            self.waiting.remove(job)
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
                self.prefix_cache.flush_writes()

    def _first_tokens(self, group: list[_Prefill], rows) -> None:
        """Each row of a batched prefill samples its first token; those not done join the
        decode batch together, their merged caches as they are (or, alone, decode solo)."""
        joining: list[tuple[int, _Prefill, int]] = []  # (row, request, its first token)
        for row, job in enumerate(group):
            state = job.state
            if state.handle.cancelled:  # during the forward: ends as a cancel while waiting does
                self._finish_safely(state, "cancelled", None, None)
                continue
            try:
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
                [_group(job.state) for _, job, _ in joining],
            )
        except Exception as exc:
            log.exception("starting a batched prefill's requests failed")
            for _, job, _ in joining:
                self._fail(job.state, f"internal error: {exc}")
            return
        for uid, (_, job, _) in zip(uids, joining):
            self.batched[uid] = job.state

    def _start_prefill(self, job: _Prefill) -> None:
        """Match the prompt against the cache (RAM, then disk) and set up its prefill."""
        state, request = job.state, job.state.handle.request
        prompt = state.prompt
        cache_on = self.prefix_cache is not None and request.use_cache and self.prefix_cache.enabled
        persister = self.persister if cache_on else None
        namespace = request.cache_namespace
        restored = (
            persister.restore(prompt, request.session, namespace) if persister is not None else 0
        )
        job.flush = bool(restored)  # the restored K/V's copy into the pool: after the first token
        prefix = self.prefix_cache.match(prompt, namespace) if cache_on else None
        state.prefix = prefix
        state.cached = prefix.length if prefix is not None else 0
        state.restored = min(restored, state.cached)
        job.caches = (
            self.prefix_cache.make_caches(prefix, room=len(prompt) - prefix.length + 1)
            if prefix is not None
            else make_prompt_cache(self.loaded.model)
        )
        cached, caches = state.cached, job.caches

        def on_prefilled(done: int) -> None:
            if done and (snap := self.prefix_cache.snapshot(caches, cached + done)):
                state.snapshots.append(snap)

        hybrid = prefix is not None and self.prefix_cache.hybrid
        job.run = ChunkedPrefill(
            self.loaded.model, prompt[cached:], caches, on_prefilled if hybrid else None
        )
        state.handle.emit(ProgressEvent(cached, len(prompt)))

    def _chunk(self, job: _Prefill, size: int) -> None:
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

    def _first_token(self, job: _Prefill) -> None:
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
                self.prefix_cache.flush_writes()

    def _sample_first(self, job: _Prefill, logits: mx.array) -> int:
        """The first token from the logits after the prompt (``(1, vocab)``)."""
        state, prompt = job.state, job.state.prompt
        if self.persister is not None:  # the rate a disk read must beat
            self.persister.observe_prefill(len(prompt) - state.cached, job.compute_s)
        seed = state.handle.request.sampling.seed
        if seed is not None:
            mx.random.seed(seed)
        history = mx.array(prompt)
        for processor in job.processors:
            logits = processor(history, logits)
        state.detok.reset()
        return job.sampler(logits - mx.logsumexp(logits, keepdims=True)).item()

    def _go_solo(self, job: _Prefill, caches: list, first: int) -> None:
        """Nothing else decodes: ``job`` decodes alone, ``first`` its next input."""
        prompt = job.state.prompt
        solo = _Solo(
            job.state,
            caches,
            job.sampler,
            job.processors,
            list(prompt) + [first],
            None,
            mx.array(prompt) if job.processors else None,
        )
        solo.pending = self._solo_forward(solo, mx.array([first]))
        self.solo = solo

    def _end_prefill(self, job: _Prefill, finish: str) -> None:
        """A waiting or prefilling request ends before its first token (cancelled)."""
        self.waiting.remove(job)
        try:
            self._finish(job.state, finish, None, None)
        finally:
            if job.flush:
                self.prefix_cache.flush_writes()

    def _end_with_error(self, job: _Prefill, exc: Exception) -> None:
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
                self.prefix_cache.release(state.prefix)
            if job.flush:
                self.prefix_cache.flush_writes()
        finally:
            state.handle.emit(event)
            state.handle.finish()
            self.on_finished()

    def _insert(self, state: _Active, last: int, caches, cache_tokens, sampler, processors) -> None:
        """Join the batch: ``last`` (taken, not yet in ``caches``) is fed at its next step."""
        uid = self.batch.join(
            last,
            caches,
            cache_tokens,
            sampler,
            processors,
            state.max_tokens - len(state.generated),
            _group(state),
        )
        self.batched[uid] = state

    # ------------------------------------------------------------------ solo decode
    def _solo_forward(self, solo: _Solo, y: mx.array) -> mx.array:
        """Feed token ``y`` (shape ``(1,)``) into the solo caches; queue sampling the next."""
        with mx.stream(generation_stream):
            logits = self.loaded.model(y[None], cache=solo.caches)[:, -1, :]
            if solo.processors:
                solo.context = mx.concatenate([solo.context, y])
                for processor in solo.processors:
                    logits = processor(solo.context, logits)
            # as the decode batch's _Batch
            if solo.sampler is greedy_sampler and not solo.processors:
                sampled = mx.argmax(logits, axis=-1)
            else:
                sampled = solo.sampler(logits - mx.logsumexp(logits, keepdims=True))
        mx.async_eval(sampled)
        return sampled

    def _solo_step(self) -> None:
        solo = self.solo
        state = solo.state
        if state.handle.cancelled:
            self.solo = None
            self._finish_safely(state, "cancelled", solo.caches, solo.cache_tokens)
            return
        current = solo.pending
        # Queue the step after this one before waiting for this token (as generate_step
        # does), unless this token is the last one max_tokens allows.
        feed = len(state.generated) + 1 < state.max_tokens
        if feed:
            solo.pending = self._solo_forward(solo, current)
        token = current.item()
        if feed:
            solo.cache_tokens.append(token)
        finish = self._take(state, token)
        if finish is None and not feed:
            finish = "length"
        if finish is not None:
            self.solo = None
            self._finish_safely(state, finish, solo.caches, solo.cache_tokens)

    def _hand_over(self) -> None:
        """A second request is coming: the solo request joins the batch. If that fails
        (out of memory...), the solo request ends with an error rather than vanishing."""
        solo, self.solo = self.solo, None
        state = solo.state
        try:
            token = solo.pending.item()  # its pending token is taken now, then fed by the batch
            finish = self._take(state, token)
            if finish is None and len(state.generated) >= state.max_tokens:
                finish = "length"
            if finish is not None or state.handle.cancelled:
                self._finish_safely(state, finish or "cancelled", solo.caches, solo.cache_tokens)
                return
            self._insert(
                state, token, solo.caches, solo.cache_tokens, solo.sampler, solo.processors
            )
        except Exception as exc:
            log.exception("moving a request into the decode batch failed")
            self._fail(state, f"internal error: {exc}")

    # ------------------------------------------------------------------ decode
    def _decode_step(self) -> None:
        """One decode step for every running request."""
        if self.solo is not None:
            self._solo_step()
            return
        for uid, state in list(self.batched.items()):
            if state.handle.cancelled:
                caches, tokens = self.batch.remove(uid)
                del self.batched[uid]
                self._finish_safely(state, "cancelled", caches, tokens)
        if not self.batched:
            return
        ending = []
        for generated in self.batch.step():
            state = self.batched.get(generated.uid)
            if state is None:
                continue
            finish = self._take(state, generated.token)
            if finish is not None or generated.finished:
                ending.append((generated, state, finish))
        # every row's token is out before the rows that end store their caches (which takes
        # a while: docs/benchmarks.md): the last rows' last tokens do not wait for them
        for generated, state, finish in ending:
            if generated.finished:  # the batch let it go, with its cache
                caches, tokens = generated.caches, generated.cache_tokens
            else:
                caches, tokens = self.batch.remove(generated.uid)
            del self.batched[generated.uid]
            self._finish_safely(state, finish or "length", caches, tokens)

    def fail_all(self, message: str) -> None:
        """A bug in a step: end every running request with an error, start a new batch."""
        for state in self.active:
            self._fail(state, message)
        self.batched.clear()
        self.solo = None
        self.batch.close()
        self.batch = DecodeBatch(self.loaded.model, MAX_BATCH)

    # ------------------------------------------------------------------ tokens
    def _take(self, state: _Active, token: int) -> str | None:
        """Record one generated token; the finish reason if the request is done."""
        if state.first_token_at is None:
            state.first_token_at = time.perf_counter()
        state.generated.append(token)
        if token in self.eos:
            return "stop"
        state.detok.add_token(token)
        piece, hit = state.stop_text.feed(state.detok.last_segment)
        self._show(state, piece, (token,))
        if hit:
            return "stop"
        if len(state.generated) >= state.max_tokens:
            return "length"
        return None

    def _show(
        self, state: _Active, piece: str, token_ids: tuple[int, ...] = (), final: bool = False
    ) -> None:
        """Send ``piece`` of the reply: tool-call markup is taken out and its calls sent as
        their own events. ``final``: the reply is over, flush what was held back."""
        calls = []
        if state.tool_text is not None:
            piece, calls = state.tool_text.feed(piece)
            if final:
                tail, more = state.tool_text.finish()
                piece, calls = piece + tail, calls + more
        if piece:
            state.shown.append(piece)
            state.handle.emit(TokenEvent(piece, token_ids))
        for call in calls:
            state.handle.emit(ToolCallEvent(call))

    def _finish_safely(self, state: _Active, finish: str, caches, cache_tokens) -> None:
        """Finish a request that already left the batch; a bug here still ends its stream."""
        try:
            self._finish(state, finish, caches, cache_tokens)
        except Exception as exc:
            log.exception("finishing a request failed")
            self._fail(state, f"internal error: {exc}")

    def _fail(self, state: _Active, message: str) -> None:
        """End ``state``'s stream with an error (a bug), giving its prefix lock back."""
        if state.prefix is not None:
            self.prefix_cache.release(state.prefix)
        state.handle.emit(ErrorEvent(message, ErrorKind.INTERNAL))
        state.handle.finish()

    def _finish(self, state: _Active, finish: str, caches, cache_tokens) -> None:
        """Flush the text, store the cache, send the stats, end the stream."""
        handle, prompt = state.handle, state.prompt
        if state.generated and not state.stop_text.hit:  # EOS, length, cancel: no more text
            state.detok.finalize()
            self._show(state, state.stop_text.finish(state.detok.last_segment))
        if state.tool_text is not None:
            self._show(state, "", final=True)
            if state.tool_text.calls and finish == "stop":
                finish = "tool_calls"
        ended = time.perf_counter()
        if state.prefix is not None:
            seen = list(cache_tokens) if cache_tokens is not None else []
            if (
                finish != "cancelled"
                and caches is not None
                and seen == (prompt + state.generated)[: len(seen)]
            ):
                try:
                    self._store(state, seen, caches)
                except Exception:  # caching may cost time, never the reply
                    log.exception("caching a finished request failed; its reply is sent anyway")
            self.prefix_cache.release(state.prefix)  # no-op once committed
        first = state.first_token_at
        ttft = (first or ended) - state.started
        decode_time = ended - (first or ended)
        n = len(state.generated)
        stats = RequestStats(
            prompt_tokens=len(prompt),
            cached_tokens=state.cached - state.restored,
            restored_tokens=state.restored,
            computed_tokens=len(prompt) - state.cached if first is not None else 0,
            completion_tokens=n,
            ttft_s=ttft,
            prefill_tps=(len(prompt) - state.cached) / ttft if ttft > 0 else 0.0,
            decode_tps=(n - 1) / decode_time if decode_time > 0 and n > 1 else 0.0,
            total_s=ended - state.started,
            constraint_cpu_s=state.grammar.cpu_s if state.grammar is not None else 0.0,
            finish_reason=finish,
            stop_sequence=state.stop_text.matched if finish == "stop" else None,
            cache_namespace=namespace_label(handle.request.cache_namespace),
        )
        calls = tuple(state.tool_text.calls) if state.tool_text is not None else ()
        failure = (
            state.grammar.failure if state.grammar is not None and finish != "cancelled" else None
        )
        # what was sent is not what the schema asks for: never a finished reply
        if failure is not None:
            handle.emit(
                ErrorEvent(
                    f"the output constraint failed after {n} tokens ({failure}); the reply "
                    "would not match the schema: a simpler schema may work",
                    ErrorKind.BAD_REQUEST,
                )
            )
        else:
            handle.emit(DoneEvent("".join(state.shown), stats, calls))
        handle.finish()
        self.on_finished()

    def _store(self, state: _Active, seen: list[int], caches: list) -> None:
        session = state.handle.request.session
        end_snapshot = self.prefix_cache.snapshot(caches, len(seen))
        resumed = [state.prefix.snapshot] if state.prefix.snapshot is not None else []  # for disk
        snapshots = resumed + state.snapshots + ([end_snapshot] if end_snapshot is not None else [])
        if self.persister is not None:  # a session's chain, or a long enough request's
            self.persister.save(session, seen, caches, snapshots, state.prefix.namespace)
        self.prefix_cache.commit(state.prefix, seen, caches, snapshots, session)
