"""One request, start to finish, on the engine thread.

Prompt rendering (chat template), reuse of a cached prefix, chunked prefill that can be
cancelled between chunks, sampling through ``mlx_lm.sample_utils``, streaming text with
stop strings held back until they can no longer match, and the request's stats.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from core.engine_types import (
    DoneEvent,
    Event,
    GenerationRequest,
    ProgressEvent,
    RequestStats,
    SamplingParams,
    TokenEvent,
)
from core.errors import ContextLengthError, UserError
from core.model_loader import LoadedModel

PREFILL_CHUNK = 256  # tokens per prefill step: cancel is checked between steps


class Cancelled(Exception):
    """Raised inside prefill when the client cancelled."""


def render_prompt(tokenizer, request: GenerationRequest) -> list[int]:
    """Token ids of the request's prompt."""
    if request.prompt_tokens is not None:
        return list(request.prompt_tokens)
    if request.prompt_text is not None:
        return list(tokenizer.encode(request.prompt_text))
    if not request.messages:
        raise UserError("empty request: no messages and no prompt")
    messages = [{"role": m.role, "content": m.content} for m in request.messages]
    if getattr(tokenizer, "has_chat_template", False):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    text = "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"
    return list(tokenizer.encode(text))


@dataclass
class _CacheEntry:
    tokens: list[int]
    cache: list


class PromptCachePool:
    """Token-exact reuse of a few recent prompt caches, the way ``mlx_lm.server`` does.

    A request takes the entry sharing the longest prefix with its prompt (trimming it to
    that prefix); after the request its cache comes back under the request's session.
    The radix tree in ``kvcache/`` replaces this.
    """

    def __init__(self, max_entries: int = 4):
        self.max_entries = max_entries
        self._entries: dict[str | None, _CacheEntry] = {}

    def take(self, tokens: list[int]) -> tuple[list | None, int]:
        best_key, best_len = None, 0
        for key, entry in self._entries.items():
            common = _common_prefix(entry.tokens, tokens)
            common = min(common, len(tokens) - 1)  # always compute at least one token
            if common > best_len:
                best_key, best_len = key, common
        if best_len == 0:
            return None, 0
        entry = self._entries.pop(best_key)
        excess = len(entry.tokens) - best_len
        if excess and not (can_trim_prompt_cache(entry.cache) and trim_prompt_cache(entry.cache, excess) == excess):
            return None, 0
        return entry.cache, best_len

    def put(self, key: str | None, tokens: list[int], cache: list) -> None:
        self._entries.pop(key, None)
        self._entries[key] = _CacheEntry(tokens, cache)
        while len(self._entries) > self.max_entries:
            self._entries.pop(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class _StopText:
    """Streams text, holding back any tail that could still become a stop string."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.emitted = 0

    def feed(self, text: str) -> tuple[str, bool]:
        """New text safe to show, and whether a stop string was hit (text cut before it)."""
        for stop in self.stops:
            at = text.find(stop, max(0, self.emitted - len(stop)))
            if at != -1:
                out = text[self.emitted : at]
                self.emitted = at
                return out, True
        hold = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:k]):
                    hold = max(hold, k)
                    break
        safe = max(self.emitted, len(text) - hold)
        out = text[self.emitted : safe]
        self.emitted = safe
        return out, False


def _sampling_tools(params: SamplingParams):
    sampler = make_sampler(
        temp=params.temperature, top_p=params.top_p, min_p=params.min_p, top_k=params.top_k
    )
    processors = make_logits_processors(
        repetition_penalty=params.repetition_penalty if params.repetition_penalty != 1.0 else None
    )
    return sampler, processors


def run_request(
    loaded: LoadedModel,
    request: GenerationRequest,
    pool: PromptCachePool | None,
    is_cancelled: Callable[[], bool],
    emit: Callable[[Event], None],
) -> RequestStats:
    """Generate for ``request``, emitting events; returns the stats also sent in DoneEvent."""
    started = time.perf_counter()
    tokenizer = loaded.tokenizer
    prompt = render_prompt(tokenizer, request)
    params = request.sampling
    context = loaded.info.context_length
    if len(prompt) >= context:
        raise ContextLengthError(
            f"the prompt is {len(prompt)} tokens but {loaded.info.name} has a context of {context}"
        )
    max_tokens = min(params.max_tokens, context - len(prompt))

    cache, cached = (None, 0)
    if pool is not None and request.use_cache:
        cache, cached = pool.take(prompt)
    if cache is None:
        cache, cached = make_prompt_cache(loaded.model), 0
    to_compute = prompt[cached:]

    if params.seed is not None:
        mx.random.seed(params.seed)
    sampler, processors = _sampling_tools(params)

    def on_progress(done: int, total: int) -> None:
        if is_cancelled():
            raise Cancelled
        emit(ProgressEvent(cached + done, len(prompt)))

    steps = generate_step(
        mx.array(to_compute),
        loaded.model,
        max_tokens=max_tokens,
        sampler=sampler,
        logits_processors=processors,
        prompt_cache=cache,
        prefill_step_size=PREFILL_CHUNK,
        prompt_progress_callback=on_progress,
    )
    detok = tokenizer.detokenizer
    detok.reset()
    stop_text = _StopText(params.stop)
    eos = set(tokenizer.eos_token_ids)
    generated: list[int] = []
    shown: list[str] = []
    first_token_at = None
    finish = "length"
    try:
        for token, _ in steps:
            if first_token_at is None:
                first_token_at = time.perf_counter()
            generated.append(token)
            if token in eos:
                finish = "stop"
                break
            detok.add_token(token)
            piece, hit = stop_text.feed(detok.text)
            if piece:
                shown.append(piece)
                emit(TokenEvent(piece, (token,)))
            if hit:
                finish = "stop"
                break
            if is_cancelled():
                finish = "cancelled"
                break
        else:
            finish = "length"
    except Cancelled:
        finish = "cancelled"
    finally:
        steps.close()

    if finish in ("length",) or (finish == "cancelled" and first_token_at is not None):
        detok.finalize()
        piece, _ = stop_text.feed(detok.text)
        tail = detok.text[stop_text.emitted :] if not stop_text.stops else ""
        for extra in (piece, tail):
            if extra:
                shown.append(extra)
                emit(TokenEvent(extra))
    ended = time.perf_counter()

    if pool is not None and request.use_cache and finish != "cancelled":
        seen = prompt + generated
        offset = _cache_length(cache)
        if offset is not None and offset <= len(seen):
            pool.put(request.session, seen[:offset], cache)

    ttft = (first_token_at or ended) - started
    decode_time = ended - (first_token_at or ended)
    stats = RequestStats(
        prompt_tokens=len(prompt),
        cached_tokens=cached,
        restored_tokens=0,
        computed_tokens=len(to_compute) if first_token_at is not None else 0,
        completion_tokens=len(generated),
        ttft_s=ttft,
        prefill_tps=len(to_compute) / ttft if ttft > 0 else 0.0,
        decode_tps=(len(generated) - 1) / decode_time if decode_time > 0 and len(generated) > 1 else 0.0,
        total_s=ended - started,
        finish_reason=finish,
    )
    emit(DoneEvent("".join(shown), stats))
    return stats


def _cache_length(cache: list) -> int | None:
    offsets = {getattr(c, "offset", None) for c in cache}
    if len(offsets) != 1 or None in offsets:
        return None
    return offsets.pop()
