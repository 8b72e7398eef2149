"""An engine request's events on the server's event loop, and the client watched while it runs.

The engine's :class:`RequestHandle` is a blocking queue fed by the engine thread. One
small thread per request drains it onto the event loop (:class:`EngineEvents`); the same
thread records the request's metrics and takes it off the in-flight list as soon as it
ends, whether or not anyone still reads the events (a client that left stops reading).
A client that goes away cancels its request: :func:`watch_disconnect` while a reply is
being computed, Starlette's ``StreamingResponse`` (which cancels the body's task) while
events are being streamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from core.api.errors import engine_error, shutting_down
from core.api.routing import SSE_HEADERS

from core.engine.engine import RequestHandle
from core.engine.types import DoneEvent, ErrorEvent, Event, TokenEvent, ToolCallEvent

if TYPE_CHECKING:
    from core.api.state import ApiState

CLIENT_GONE = "radixchat.client_gone"  # scope key: the guard counts a 499 for this request


class EngineEvents:
    """The events of one submitted request, as an async iterator (ends after Done/Error)."""

    def __init__(self, api: "ApiState", handle: RequestHandle, request: Request, arrived: float):
        self.api = api
        self.handle = handle
        self._scope, self._receive = request.scope, request.receive
        self._arrived = arrived
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        threading.Thread(target=self._pump, name="radixchat-api-events", daemon=True).start()

    def _pump(self) -> None:
        first_token_at = None
        try:
            for event in self.handle.events():
                if isinstance(event, (TokenEvent, ToolCallEvent)) and first_token_at is None:
                    first_token_at = time.monotonic()
                elif isinstance(event, DoneEvent):
                    ttft = (first_token_at or time.monotonic()) - self._arrived
                    self.api.metrics.record_generation(event.stats, ttft)
                if isinstance(event, (DoneEvent, ErrorEvent)):
                    self.api.release(self.handle)  # no longer in flight, before the reply is sent
                self._put(event)
        finally:
            self.api.release(self.handle)
            self._put(None)

    def _put(self, item: Event | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        return event

    async def first(self) -> Event | None:
        """The next event (None at the end), cancelling the request if the client leaves meanwhile."""
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


async def reply_whole(request: Request, handle: RequestHandle, events: "EngineEvents", chat: bool,
                      body: Callable[[DoneEvent], dict[str, Any]]) -> Response:
    """A non-streaming route's answer, shared by both dialects: the reply ``body`` makes
    from the finished request, a 499 if the client left, or the engine's error."""
    try:
        done, error = await events.collect()
    finally:
        handle.cancel()  # a no-op once the request has ended
    if request.scope.get(CLIENT_GONE):
        return Response(status_code=499)  # nobody will read it
    if error is not None:
        raise engine_error(error, chat)
    if done is None or done.stats.finish_reason == "cancelled":
        raise shutting_down()
    return JSONResponse(body(done))


async def reply_stream(request: Request, handle: RequestHandle, events: "EngineEvents", chat: bool,
                       chunks: Callable[[Event], AsyncIterator[bytes]]) -> Response:
    """A streaming route's answer, shared by both dialects: an error before anything is sent
    is an HTTP error; after the first event, ``chunks(first)`` streams the rest."""
    first = await events.first()
    if isinstance(first, ErrorEvent) or first is None or request.scope.get(CLIENT_GONE):
        handle.cancel()
        if request.scope.get(CLIENT_GONE):
            return Response(status_code=499)
        raise engine_error(first, chat) if first is not None else shutting_down()
    return StreamingResponse(chunks(first), media_type="text/event-stream", headers=SSE_HEADERS)


def sse(body: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event: ``data: JSON`` (OpenAI), with an ``event:`` line (Anthropic)."""
    data = body if isinstance(body, str) else json.dumps(body)
    return (f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode()
