"""One request, start to finish, on the engine thread.

Prompt rendering (chat template), reuse of a cached prefix, chunked prefill that can be
cancelled between chunks, sampling through ``mlx_lm.sample_utils``, streaming text with
stop strings held back until they can no longer match, and the request's stats.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache
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
from kvcache.persist import SessionPersister
from kvcache.prefix_cache import PrefixCache

PREFILL_CHUNK = 256  # tokens per prefill step: cancel is checked between steps
SINGLE_CALL_TAIL = 64  # a remaining prompt this short is computed in one model call


class Cancelled(Exception):
    """Raised inside prefill when the client cancelled."""


def render_prompt(tokenizer, request: GenerationRequest) -> list[int]:
    """Token ids of the request's prompt (never empty)."""
    tokens = _render(tokenizer, request)
    if not tokens:
        raise UserError("empty prompt: nothing to generate from")
    return tokens


def _render(tokenizer, request: GenerationRequest) -> list[int]:
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


def token_steps(
    model,
    tokens: list[int],
    cache: list,
    sampler,
    processors: list,
    history: list[int],
    on_chunk: Callable[[int], None],
    on_prefilled: Callable[[int], None] | None = None,
) -> Iterator[int]:
    """Prefill ``tokens`` in chunks into ``cache``, then yield sampled token ids forever.

    ``history`` (the tokens before ``tokens``) feeds the logits processors. ``on_chunk``
    runs after every prefill chunk (raise :class:`Cancelled` there to stop);
    ``on_prefilled(n)`` runs when all but the last prompt token are in the cache (``n``
    of ``tokens``): the engine snapshots hybrid state there, so the same prompt asked
    again (regenerate) can resume right before its last token. Like mlx-lm's
    ``generate_step``, step n+1 is queued before token n is handed out, so every token
    handed out has also been fed to the cache.
    """
    seen = mx.array(history + tokens) if processors else None

    def sample(logits: mx.array) -> mx.array:
        for processor in processors:
            logits = processor(seen, logits)
        return sampler(logits - mx.logsumexp(logits, keepdims=True))

    # Chunks of the prompt: only the cache is evaluated, so the vocabulary projection of
    # those positions is never computed. A short tail (a follow-up turn) goes in as one
    # call whose last position gives the logits; a long prompt ends with its last token
    # alone, so the projection stays one row.
    done = 0
    tail = 1 if on_prefilled is not None else SINGLE_CALL_TAIL
    while len(tokens) - done > tail:
        chunk = tokens[done : min(done + PREFILL_CHUNK, len(tokens) - 1)]
        with mx.stream(generation_stream):
            model(mx.array(chunk)[None], cache=cache)
        mx.eval([c.state for c in cache])
        done += len(chunk)
        on_chunk(done)
    if on_prefilled is not None:
        on_prefilled(done)  # all but the last prompt token are in the cache
    with mx.stream(generation_stream):
        logits = model(mx.array(tokens[done:])[None], cache=cache)[:, -1, :]
    mx.eval(logits, [c.state for c in cache])
    on_chunk(len(tokens))
    with mx.stream(generation_stream):
        y = sample(logits)
    mx.async_eval(y)
    while True:
        with mx.stream(generation_stream):
            if processors:
                seen = mx.concatenate([seen, y])
            next_y = sample(model(y[:, None], cache=cache)[:, -1, :])
        mx.async_eval(next_y)
        yield y.item()
        y = next_y


def run_request(
    loaded: LoadedModel,
    request: GenerationRequest,
    prefix_cache: PrefixCache | None,
    is_cancelled: Callable[[], bool],
    emit: Callable[[Event], None],
    persister: SessionPersister | None = None,
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
    if prefix_cache is not None and not (request.use_cache and prefix_cache.enabled):
        prefix_cache = persister = None
    if persister is not None and request.session is None:
        persister = None
    restored = persister.restore(request.session, prompt) if persister is not None else 0
    prefix = prefix_cache.match(prompt) if prefix_cache is not None else None
    try:
        return _generate(loaded, request, prompt, max_tokens, prefix_cache, prefix, started,
                         is_cancelled, emit, persister, restored)
    finally:
        if prefix is not None:
            prefix_cache.release(prefix)  # no-op once committed


def _generate(loaded, request, prompt, max_tokens, prefix_cache, prefix, started, is_cancelled, emit,
              persister, restored):
    params = request.sampling
    tokenizer = loaded.tokenizer
    if prefix is not None:
        cache, cached = prefix_cache.make_caches(prefix), prefix.length
    else:
        cache, cached = make_prompt_cache(loaded.model), 0
    to_compute = prompt[cached:]
    snapshots = []

    def on_prefilled(done: int) -> None:
        if done and (snap := prefix_cache.snapshot(cache, cached + done)):
            snapshots.append(snap)

    if params.seed is not None:
        mx.random.seed(params.seed)
    sampler, processors = _sampling_tools(params)

    def on_chunk(done: int) -> None:
        if is_cancelled():
            raise Cancelled
        emit(ProgressEvent(cached + done, len(prompt)))

    emit(ProgressEvent(cached, len(prompt)))
    hybrid = prefix_cache is not None and prefix_cache.hybrid
    steps = token_steps(loaded.model, to_compute, cache, sampler, processors, prompt[:cached],
                        on_chunk, on_prefilled if hybrid else None)
    detok = tokenizer.detokenizer
    detok.reset()
    stop_text = _StopText(params.stop)
    eos = set(tokenizer.eos_token_ids)
    generated: list[int] = []
    shown: list[str] = []
    first_token_at = None
    finish = "length"
    try:
        for token in steps:
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
            if len(generated) >= max_tokens:
                break
            if is_cancelled():
                finish = "cancelled"
                break
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

    if prefix is not None and finish != "cancelled":
        seen = prompt + generated  # every token handed out was also fed to the cache
        end_snapshot = prefix_cache.snapshot(cache, len(seen))
        if end_snapshot is not None:
            snapshots.append(end_snapshot)
        if persister is not None:  # serialized now, written by the cache writer thread
            persister.save(request.session, seen, cache, snapshots)
        prefix_cache.commit(prefix, seen, cache, snapshots, request.session)

    ttft = (first_token_at or ended) - started
    decode_time = ended - (first_token_at or ended)
    restored = min(restored, cached)
    stats = RequestStats(
        prompt_tokens=len(prompt),
        cached_tokens=cached - restored,
        restored_tokens=restored,
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
