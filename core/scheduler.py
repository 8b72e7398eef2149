"""Requests on the engine thread: prefill one at a time, decode together in one batch.

A new request is rendered, matched against the prefix cache and prefilled on its own
(in chunks, cancellable, snapshotting hybrid state right before its last prompt token);
the first token is sampled from that prefill's logits, so time to first token never
waits for other requests. Then the request joins mlx-lm's ``BatchGenerator``, which
takes per-request prompt caches and decodes every running request in one forward pass
per step. When a request ends (EOS, stop string, max tokens, cancel) it leaves the
batch with its cache, which goes into the radix tree and, for sessions, to disk.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache

from core.engine_types import DoneEvent, ErrorEvent, ProgressEvent, RequestStats, TokenEvent
from core.errors import ContextLengthError
from core.generation import PREFILL_CHUNK, Cancelled, StopText, prefill, render_prompt, sampling_tools

MAX_BATCH = 16  # requests decoded together

log = logging.getLogger(__name__)


@dataclass
class _Active:
    """One running request (engine thread only)."""

    handle: object  # core.engine.RequestHandle
    prompt: list[int]
    prefix: object | None  # kvcache.prefix_cache.Prefix
    cached: int
    restored: int
    started: float
    max_tokens: int
    stop_text: StopText
    detok: object
    first_token_at: float | None = None
    generated: list[int] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)
    snapshots: list = field(default_factory=list)


class Scheduler:
    """Admits requests and steps the shared decode batch of one loaded model."""

    def __init__(self, loaded, prefix_cache, persister, on_finished=lambda: None,
                 on_progress=lambda: None):
        self.loaded = loaded
        self.on_finished = on_finished
        self.on_progress = on_progress  # after each prefill chunk (live memory panels)
        self.prefix_cache = prefix_cache
        self.persister = persister
        self.eos = set(loaded.tokenizer.eos_token_ids)
        self.batch = BatchGenerator(loaded.model, completion_batch_size=MAX_BATCH,
                                    prefill_batch_size=MAX_BATCH, prefill_step_size=PREFILL_CHUNK)
        self.active: dict[int, _Active] = {}

    @property
    def busy(self) -> bool:
        return bool(self.active)

    # ------------------------------------------------------------------ admit
    def admit(self, handle) -> None:
        """Prefill ``handle``'s request and start decoding it (or finish it at once)."""
        request, loaded = handle.request, self.loaded
        started = time.perf_counter()
        prompt = render_prompt(loaded.tokenizer, request)
        context = loaded.info.context_length
        if len(prompt) >= context:
            raise ContextLengthError(
                f"the prompt is {len(prompt)} tokens but {loaded.info.name} has a context of {context}"
            )
        cache_on = self.prefix_cache is not None and request.use_cache and self.prefix_cache.enabled
        persister = self.persister if cache_on and request.session is not None else None
        restored = persister.restore(request.session, prompt) if persister is not None else 0
        prefix = self.prefix_cache.match(prompt) if cache_on else None
        try:
            self._admit(handle, prompt, prefix, restored, started, min(request.sampling.max_tokens,
                                                                        context - len(prompt)))
        except BaseException:
            if prefix is not None:
                self.prefix_cache.release(prefix)
            raise

    def _admit(self, handle, prompt, prefix, restored, started, max_tokens) -> None:
        params = handle.request.sampling
        caches = self.prefix_cache.make_caches(prefix) if prefix is not None else make_prompt_cache(self.loaded.model)
        cached = prefix.length if prefix is not None else 0
        detok = self.loaded.tokenizer.detokenizer
        detok.reset()
        state = _Active(handle, prompt, prefix, cached, min(restored, cached), started, max_tokens,
                        StopText(params.stop), detok)

        def on_chunk(done: int) -> None:
            if handle.cancelled:
                raise Cancelled
            handle._emit(ProgressEvent(cached + done, len(prompt)))
            self.on_progress()

        def on_prefilled(done: int) -> None:
            if done and (snap := self.prefix_cache.snapshot(caches, cached + done)):
                state.snapshots.append(snap)

        if params.seed is not None:
            mx.random.seed(params.seed)
        sampler, processors = sampling_tools(params)
        handle._emit(ProgressEvent(cached, len(prompt)))
        hybrid = prefix is not None and self.prefix_cache.hybrid
        try:
            logits = prefill(self.loaded.model, prompt[cached:], caches, on_chunk,
                             on_prefilled if hybrid else None)
        except Cancelled:
            self._finish(state, "cancelled", None, None)
            return
        history = mx.array(prompt)
        for processor in processors:
            logits = processor(history, logits)
        first = sampler(logits - mx.logsumexp(logits, keepdims=True)).item()
        finish = self._take(state, first)
        if finish is not None:  # done after one token: the cache holds the prompt
            self._finish(state, finish, caches, prompt)
            return
        uid = self.batch.insert([[first]], max_tokens=[max_tokens - 1], caches=[caches],
                                all_tokens=[list(prompt)], samplers=[sampler],
                                logits_processors=[processors])[0]
        self.active[uid] = state

    # ------------------------------------------------------------------ decode
    def step(self) -> None:
        """One batched decode step for every running request."""
        for uid, state in list(self.active.items()):
            if state.handle.cancelled:
                caches, tokens = self.batch.remove([uid], return_prompt_caches=True)[uid]
                del self.active[uid]
                self._finish_safely(state, "cancelled", caches, tokens)
        if not self.active:
            return
        for response in self.batch.next_generated():
            state = self.active.get(response.uid)
            if state is None:
                continue
            finish = self._take(state, response.token)
            if finish is None and response.finish_reason is None:
                continue
            if response.finish_reason is not None:  # the batch let it go, with its cache
                caches, tokens = response.prompt_cache, response.all_tokens
            else:
                caches, tokens = self.batch.remove([response.uid], return_prompt_caches=True)[response.uid]
            del self.active[response.uid]
            self._finish_safely(state, finish or "length", caches, tokens)

    def fail_all(self, message: str) -> None:
        """A bug in a step: end every running request with an error, start a new batch."""
        for state in self.active.values():
            if state.prefix is not None:
                self.prefix_cache.release(state.prefix)
            state.handle._emit(ErrorEvent(message, user_error=False))
            state.handle._finish()
        self.active.clear()
        self.batch = BatchGenerator(self.loaded.model, completion_batch_size=MAX_BATCH,
                                    prefill_batch_size=MAX_BATCH, prefill_step_size=PREFILL_CHUNK)

    # ------------------------------------------------------------------ tokens
    def _take(self, state: _Active, token: int) -> str | None:
        """Record one generated token; the finish reason if the request is done."""
        if state.first_token_at is None:
            state.first_token_at = time.perf_counter()
        state.generated.append(token)
        if token in self.eos:
            return "stop"
        state.detok.add_token(token)
        piece, hit = state.stop_text.feed(state.detok.text)
        if piece:
            state.shown.append(piece)
            state.handle._emit(TokenEvent(piece, (token,)))
        if hit:
            return "stop"
        if len(state.generated) >= state.max_tokens:
            return "length"
        return None

    def _finish_safely(self, state: _Active, finish: str, caches, cache_tokens) -> None:
        """Finish a request that already left the batch; a bug here still ends its stream."""
        try:
            self._finish(state, finish, caches, cache_tokens)
        except Exception as exc:
            log.exception("finishing a request failed")
            if state.prefix is not None:
                self.prefix_cache.release(state.prefix)
            state.handle._emit(ErrorEvent(f"internal error: {exc}", user_error=False))
            state.handle._finish()

    def _finish(self, state: _Active, finish: str, caches, cache_tokens) -> None:
        """Flush the text, store the cache, send the stats, end the stream."""
        handle, prompt = state.handle, state.prompt
        if finish == "length" or (finish == "cancelled" and state.first_token_at is not None):
            state.detok.finalize()
            piece, _ = state.stop_text.feed(state.detok.text)
            tail = state.detok.text[state.stop_text.emitted :] if not state.stop_text.stops else ""
            for extra in (piece, tail):
                if extra:
                    state.shown.append(extra)
                    handle._emit(TokenEvent(extra))
        ended = time.perf_counter()
        if state.prefix is not None:
            seen = list(cache_tokens) if cache_tokens is not None else []
            if finish != "cancelled" and caches is not None and seen == (prompt + state.generated)[: len(seen)]:
                self._store(state, seen, caches)
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
            finish_reason=finish,
        )
        handle._emit(DoneEvent("".join(state.shown), stats))
        handle._finish()
        self.on_finished()

    def _store(self, state: _Active, seen: list[int], caches: list) -> None:
        session = state.handle.request.session
        end_snapshot = self.prefix_cache.snapshot(caches, len(seen))
        resumed = [state.prefix.snapshot] if state.prefix.snapshot is not None else []  # for disk
        snapshots = resumed + state.snapshots + ([end_snapshot] if end_snapshot is not None else [])
        if self.persister is not None and session is not None:
            self.persister.save(session, seen, caches, snapshots)
        self.prefix_cache.commit(state.prefix, seen, caches, snapshots, session)
