"""An engine request's events on the server's event loop, and the client watched while it runs.

The engine's :class:`RequestHandle` is a queue fed by the engine thread. It wakes the
event loop when events arrive (:class:`_Waker`: one wake-up per decode step for all the
streams it fed), and on the loop :class:`EngineEvents` takes them, records the request's
metrics and takes it off the in-flight list as soon as it ends, whether or not anyone
still reads the events (a client that left stops reading).
A client that goes away cancels its request: :func:`watch_disconnect` while a reply is
being computed, Starlette's ``StreamingResponse`` (which cancels the body's task) while
events are being streamed.

A client that stays but stops reading a stream is cut off. Its events are sent as fast as
its socket takes them; once the kernel's buffers and the transport's are full, they pile
up here. When ``ApiState.max_unsent_events`` of them wait (``core.api.state.MAX_UNSENT_EVENTS``:
a few hundred tokens past everything the buffers hold), the request is cancelled, so it gives
its decode row back, and the stream ends with an error event after what was already
queued. The choice was cancel rather than park: a parked request keeps its KV in memory
for as long as its client likes, so a client that opens streams and never reads would
hold memory without bound; a slow client that keeps reading is never this far behind.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from core.engine.engine import RequestHandle
from core.engine.types import (
    DoneEvent,
    ErrorEvent,
    Event,
    ReasoningEvent,
    TokenEvent,
    ToolCallEvent,
)
from core.errors import ErrorKind

if TYPE_CHECKING:
    from core.api.state import ApiState

log = logging.getLogger(__name__)

CLIENT_GONE = "radixchat.client_gone"  # scope key: the guard counts a 499 for this request


class EngineEvents:
    """The events of one submitted request, as an async iterator (ends after Done/Error)."""

    def __init__(self, api: ApiState, handle: RequestHandle, request: Request, arrived: float):
        self.api = api
        self.handle = handle
        self._scope, self._receive = request.scope, request.receive
        self._arrived = arrived
        self._first_token_at: float | None = None
        self._ended = False
        self.bounded = False  # a stream: cut off when its client falls too far behind
        self.cut_off = False
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        handle.on_events(_waker(api, asyncio.get_running_loop()).wake_for(self))

    def take_arrived(self) -> None:
        """On the event loop: move what the engine sent onto the queue, recording the
        request's metrics and taking it off the in-flight list as soon as it ends, whether
        or not anyone still reads the events (a client that left stops reading)."""
        if self._ended:
            return
        events, ended = self.handle.take()
        for event in events:
            if (
                isinstance(event, (TokenEvent, ReasoningEvent, ToolCallEvent))
                and self._first_token_at is None
            ):
                self._first_token_at = time.monotonic()
            elif isinstance(event, DoneEvent):
                ttft = (self._first_token_at or time.monotonic()) - self._arrived
                self.api.metrics.record_generation(event.stats, ttft)
                self.api.request_log.record(self._scope.get("path", ""), event.stats, ttft)
                _log_done(self._scope.get("path", ""), event.stats, ttft)
            elif isinstance(event, ErrorEvent):
                self.api.request_log.record_error(self._scope.get("path", ""), event.message)
            if isinstance(event, (DoneEvent, ErrorEvent)):
                self.api.release(self.handle)  # no longer in flight, before the reply is sent
            elif (
                self.bounded
                and not self.cut_off
                and self._queue.qsize() >= self.api.max_unsent_events
            ):
                self._cut_off()
            if not self.cut_off:
                self._queue.put_nowait(event)
        if ended:
            self._ended = True
            self.api.release(self.handle)
            self._queue.put_nowait(None)

    def _cut_off(self) -> None:
        """The client stopped reading: cancel the request (its decode row is freed at the next
        step), end the stream with an error after what is queued, drop what comes after."""
        waiting = self._queue.qsize()
        self.cut_off = True
        self.handle.cancel()
        log.info(
            "a stream's client stopped reading (%d events waiting): its request is cancelled",
            waiting,
        )
        self._queue.put_nowait(
            ErrorEvent(
                f"the client stopped reading: {waiting} events were waiting to be "
                "sent, so the reply was cut off here and its request cancelled",
                ErrorKind.BAD_REQUEST,
            )
        )

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        return event

    async def first(self) -> Event | None:
        """The next event (None at the end), cancelling the request if the client leaves
        meanwhile."""
        async with watch_disconnect(self._scope, self._receive, self.handle):
            return await self._queue.get()

    async def collect(self) -> tuple[DoneEvent | None, ErrorEvent | None]:
        """Wait for the end (client watched); the DoneEvent or the ErrorEvent."""
        done = error = None
        async with watch_disconnect(self._scope, self._receive, self.handle):
            async for event in self:
                if isinstance(event, DoneEvent):
                    done = event
                elif isinstance(event, ErrorEvent):
                    error = event
        return done, error


def _log_done(path: str, stats, ttft_s: float) -> None:
    """One line a finished request (``radixchat -v serve`` shows them): what a client's
    requests cost, where the cache served them, without a metrics scrape."""
    log.info(
        "%s: %d prompt tokens (%d from RAM, %d from disk, %d computed), %d generated, "
        "TTFT %.2f s, %s",
        path,
        stats.prompt_tokens,
        stats.cached_tokens,
        stats.restored_tokens,
        stats.computed_tokens,
        stats.completion_tokens,
        ttft_s,
        stats.finish_reason,
    )


class _Waker:
    """Wakes the event loop for the requests whose events arrived: the engine thread marks
    a request ready, and one callback on the loop takes the events of every request marked
    since it last ran. A decode step that sends a token to each of N streams costs the
    loop one wake-up, not N (nor N threads, one per request, blocking on their queues)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._ready: collections.deque[EngineEvents] = collections.deque()
        self._scheduled = False

    def wake_for(self, events: EngineEvents) -> Callable[[], None]:
        # engine thread (or a prompt thread refusing a prompt: appends are safe)
        def wake() -> None:
            self._ready.append(events)
            if not self._scheduled:
                self._scheduled = True
                with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped
                    self.loop.call_soon_threadsafe(self._take_all)

        return wake

    def _take_all(self) -> None:  # event loop
        self._scheduled = False  # before taking: a request marked from now on schedules again
        while self._ready:
            self._ready.popleft().take_arrived()


def _waker(api: ApiState, loop: asyncio.AbstractEventLoop) -> _Waker:
    """The API's waker on ``loop`` (one per server; a new one if the server runs a new loop)."""
    waker = api.events_waker
    if waker is None or waker.loop is not loop:
        waker = api.events_waker = _Waker(loop)
    return waker


@contextlib.asynccontextmanager
async def watch_disconnect(scope: dict, receive: Callable, handle: RequestHandle):
    """While inside: if the client disconnects, cancel ``handle`` and mark the request's scope."""

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope[CLIENT_GONE] = True
        handle.cancel()

    task = asyncio.create_task(watch())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def sse(body: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event: ``data: JSON`` (OpenAI), with an ``event:`` line (Anthropic)."""
    data = body if isinstance(body, str) else json.dumps(body)
    return (f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode()
