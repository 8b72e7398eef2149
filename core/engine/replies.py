"""The scheduler's reply path: each generated token taken (end of sequence, stop strings,
max tokens), its text and tool calls sent, and a request finished (its cache stored, its
stats sent, its stream ended). :class:`Finisher`, a component the
:class:`core.engine.scheduler.Scheduler` holds (``scheduler.replies``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from core.engine.namespaces import label as namespace_label
from core.engine.running import Active
from core.engine.types import (
    DoneEvent,
    ErrorEvent,
    ReasoningEvent,
    RequestStats,
    TokenEvent,
    ToolCallEvent,
)
from core.errors import ErrorKind

if TYPE_CHECKING:  # annotations only
    from kvcache.tiered import TieredCache

log = logging.getLogger(__name__)

# how much of a call cut by max_tokens its error repeats
CUT_CALL_SHOWN = 4000


class Finisher:
    """The replies of one loaded model's requests: ``eos``, its end-of-sequence token ids;
    ``cache``, the KV cache a finished request is committed to (None: caching is off);
    ``on_finished``, called once each request has ended (the engine's count)."""

    def __init__(
        self,
        eos: set[int],
        cache: TieredCache | None,
        on_finished: Callable[[], None] = lambda: None,
    ):
        self.eos = eos
        self.cache = cache
        self.on_finished = on_finished

    def take(self, state: Active, token: int) -> str | None:
        """Record one generated token; the finish reason if the request is done."""
        if state.first_token_at is None:
            state.first_token_at = time.perf_counter()
        state.generated.append(token)
        if token in self.eos:
            return "stop"
        if state.reasoning is not None:
            state.reasoning.count(token)
        state.detok.add_token(token)
        piece, hit = state.stop_text.feed(state.detok.last_segment)
        self.show(state, piece, (token,))
        if hit:
            return "stop"
        if len(state.generated) >= state.max_tokens:
            return "length"
        return None

    def show(
        self, state: Active, piece: str, token_ids: tuple[int, ...] = (), final: bool = False
    ) -> None:
        """Send ``piece`` of the reply: a reasoning model's thinking is taken out and sent as
        its own events, then tool-call markup is taken out of the answer (never out of the
        thinking) and its calls sent as their own events. ``final``: the reply is over,
        flush what was held back."""
        if state.reasoning is not None:
            thinking, piece = state.reasoning.feed(piece)
            if final:
                more, tail = state.reasoning.finish()
                thinking, piece = thinking + more, piece + tail
            if thinking:
                state.thought.append(thinking)
                state.handle.emit(ReasoningEvent(thinking, token_ids))
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

    def finish_safely(self, state: Active, finish: str, caches, cache_tokens) -> None:
        """Finish a request that already left the batch; a bug here still ends its stream."""
        try:
            self.finish(state, finish, caches, cache_tokens)
        except Exception as exc:
            log.exception("finishing a request failed")
            self.fail(state, f"internal error: {exc}")

    def fail(self, state: Active, message: str) -> None:
        """End ``state``'s stream with an error (a bug), giving its prefix lock back."""
        if state.prefix is not None:
            self.cache.release(state.prefix)
        state.handle.emit(ErrorEvent(message, ErrorKind.INTERNAL))
        state.handle.finish()

    def finish(self, state: Active, finish: str, caches, cache_tokens) -> None:
        """Flush the text, store the cache, send the stats, end the stream."""
        handle, prompt = state.handle, state.prompt
        if state.generated and not state.stop_text.hit:  # EOS, length, cancel: no more text
            state.detok.finalize()
            self.show(state, state.stop_text.finish(state.detok.last_segment))
        if state.tool_text is not None or state.reasoning is not None:
            self.show(state, "", final=True)
        if state.tool_text is not None:
            if state.tool_text.calls and finish == "stop":
                finish = "tool_calls"
        ended = time.perf_counter()
        if state.prefix is not None:
            # kept: what the caches hold past the matched prefix, when it is the prompt and
            # the reply as taken; a cancelled request's too (what it computed: a client that
            # timed out and sends the same prompt again reads it back)
            seen = list(cache_tokens) if cache_tokens is not None else []
            if (
                caches is not None
                and len(seen) > state.prefix.length
                and seen == (prompt + state.generated)[: len(seen)]
            ):
                try:
                    self._store(state, seen, caches)
                except Exception:  # caching may cost time, never the reply
                    log.exception("caching a finished request failed; its reply is sent anyway")
            self.cache.release(state.prefix)  # no-op once committed
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
            draft_tokens=state.drafted,
            accepted_tokens=state.accepted,
            reasoning_tokens=state.reasoning.tokens if state.reasoning is not None else 0,
        )
        calls = tuple(state.tool_text.calls) if state.tool_text is not None else ()
        failure = (
            state.grammar.failure if state.grammar is not None and finish != "cancelled" else None
        )
        cut = cut_call(state, finish)
        # what was sent is not what the schema asks for: never a finished reply
        if failure is not None:
            handle.emit(
                ErrorEvent(
                    f"the output constraint failed after {n} tokens ({failure}); the reply "
                    "would not match the schema: a simpler schema may work",
                    ErrorKind.BAD_REQUEST,
                )
            )
        elif cut is not None:
            handle.emit(ErrorEvent(cut, ErrorKind.BAD_REQUEST))
        else:
            handle.emit(
                DoneEvent(
                    "".join(state.shown),
                    stats,
                    calls,
                    "".join(state.thought),
                    tuple(prompt),
                    tuple(state.generated),
                )
            )
        handle.finish()
        self.on_finished()

    def _store(self, state: Active, seen: list[int], caches: list) -> None:
        session = state.handle.request.session
        end_snapshot = self.cache.snapshot(caches, len(seen))
        resumed = [state.prefix.snapshot] if state.prefix.snapshot is not None else []  # for disk
        snapshots = resumed + state.snapshots + ([end_snapshot] if end_snapshot is not None else [])
        self.cache.commit(state.prefix, seen, caches, snapshots, session)  # RAM, and disk


def cut_call(state: Active, finish: str) -> str | None:
    """The error for a reply that ``max_tokens`` cut inside a tool call, or before a forced
    call (``tool_choice`` required or a named tool) began: the call so far, so the client
    sees what was cut instead of an empty reply with no call. None for any other reply."""
    request = state.handle.request
    tool_text = state.tool_text
    if finish != "length" or tool_text is None or tool_text.calls:
        return None
    forced = request.tool_choice in ("required", "function")
    if tool_text.unfinished is None and not forced:
        return None
    so_far = tool_text.unfinished if tool_text.unfinished is not None else "".join(state.shown)
    so_far = so_far.replace("\n", " ")
    if len(so_far) > CUT_CALL_SHOWN:
        so_far = so_far[:CUT_CALL_SHOWN] + f"... ({len(so_far)} characters)"
    return (
        f"the tool call was cut by max_tokens ({len(state.generated)} tokens) before it was "
        f"complete: raise max_tokens. The call so far: {so_far or '(nothing yet)'}"
    )
