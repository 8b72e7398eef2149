"""One generation request's route, the same in every dialect: :func:`run_generation`.

A dialect's route checks its body and builds the engine's :class:`GenerationRequest` (each
in its own way: a stored history to continue, a template to read, a body that only loads
the model); from there it hands over to :func:`run_generation`, with a
:class:`ReplyWriter` that says how the dialect writes a reply. What is the same for every
dialect happens here: the request is submitted, its events are taken on the event loop
(:class:`core.api.relay.EngineEvents`: metrics, the request log, a client that leaves),
and the answer is either

- whole: the engine's error as an HTTP error (:func:`core.api.errors.engine_error`), a 499
  when the client left, a 503 when the server stopped, else the writer's body as JSON; or
- streamed: an error before the first event is still an HTTP error; after it, the writer
  turns each event into bytes (server-sent events, or Ollama's NDJSON), and an error or
  the server stopping mid-stream into the dialect's error event; the stream ends after
  the engine's last event, and a client that leaves cancels the request.

The answer carries the header that names its cache namespace (:func:`named`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from core.api.errors import ApiError, engine_error, shutting_down
from core.api.relay import CLIENT_GONE, EngineEvents
from core.api.routing import SSE_HEADERS, named, server_of
from core.engine.types import (
    DoneEvent,
    ErrorEvent,
    Event,
    GenerationRequest,
    ProgressEvent,
    ReasoningEvent,
    TokenEvent,
    ToolCall,
    ToolCallEvent,
)

SSE = "text/event-stream"


class ReplyWriter(ABC):
    """How one dialect writes one reply: a new writer per request (a stream's writer keeps
    what it has sent so far). ``chat``: an engine error about the prompt names the chat
    field (``messages``) rather than ``prompt``; ``media_type``: the stream's."""

    chat: bool = True
    media_type: str = SSE

    @abstractmethod
    async def whole(self, done: DoneEvent) -> dict[str, Any]:
        """The body of the answer without ``stream``, from the finished request."""

    def opening(self, first: Event) -> Iterable[bytes]:
        """What a stream sends before its first event (``first``: the engine's)."""
        return ()

    @abstractmethod
    def token(self, text: str) -> Iterable[bytes]:
        """A stream's bytes for a piece of the reply's text."""

    @abstractmethod
    def reasoning(self, text: str) -> Iterable[bytes]:
        """A stream's bytes for a piece of the reply's thinking."""

    @abstractmethod
    def tool_call(self, call: ToolCall) -> Iterable[bytes]:
        """A stream's bytes for a tool call the reply makes."""

    def progress(self, event: ProgressEvent) -> Iterable[bytes]:
        """A stream's bytes while the prompt is prefilled (most dialects send none)."""
        return ()

    @abstractmethod
    async def finished(self, done: DoneEvent) -> Iterable[bytes]:
        """A stream's last bytes, for the request that finished."""

    @abstractmethod
    def failed(self, error: ApiError) -> Iterable[bytes]:
        """A stream's last bytes, for an error after it started."""


async def run_generation(
    request: Request,
    generation: GenerationRequest,
    writer: ReplyWriter,
    arrived: float,
    stream: bool,
) -> Response:
    """Submit ``generation`` and answer with its reply, whole or streamed, as ``writer``
    writes it; ``arrived``: when the request came in (its time to first token counts from
    there). Raises :class:`ApiError` for what fails before anything is sent."""
    api = server_of(request)
    handle = api.submit(generation)
    events = EngineEvents(api, handle, request, arrived)
    if stream:
        response = await _streamed(request, events, writer)
    else:
        response = await _whole(request, events, writer)
    return named(response, generation.cache_namespace)


async def _whole(request: Request, events: EngineEvents, writer: ReplyWriter) -> Response:
    """The answer without ``stream``: the writer's body, a 499 if the client left, or the
    engine's error."""
    try:
        done, error = await events.collect()
    finally:
        events.handle.cancel()  # a no-op once the request has ended
    if request.scope.get(CLIENT_GONE):
        return Response(status_code=499)  # nobody will read it
    if error is not None:
        raise engine_error(error, writer.chat)
    if done is None or done.stats.finish_reason == "cancelled":
        raise shutting_down()
    return JSONResponse(await writer.whole(done))


async def _streamed(request: Request, events: EngineEvents, writer: ReplyWriter) -> Response:
    """The streamed answer: an error before anything is sent is an HTTP error; after the
    first event, the writer's bytes."""
    events.bounded = True  # from here on, a client that stops reading is cut off
    first = await events.first()
    if isinstance(first, ErrorEvent) or first is None or request.scope.get(CLIENT_GONE):
        events.handle.cancel()
        if request.scope.get(CLIENT_GONE):
            return Response(status_code=499)
        raise engine_error(first, writer.chat) if first is not None else shutting_down()
    return StreamingResponse(
        _chunks(writer, first, events), media_type=writer.media_type, headers=SSE_HEADERS
    )


async def _chunks(writer: ReplyWriter, first: Event, events: EngineEvents) -> AsyncIterator[bytes]:
    """The stream's bytes, up to the engine's last event; if the client leaves, Starlette
    cancels this and the request is cancelled with it."""
    try:
        for chunk in writer.opening(first):
            yield chunk
        event: Event | None = first
        while event is not None:
            last = isinstance(event, (ErrorEvent, DoneEvent))
            if isinstance(event, ErrorEvent):
                chunks = writer.failed(engine_error(event, writer.chat))
            elif isinstance(event, DoneEvent):
                if event.stats.finish_reason == "cancelled":  # the server is stopping
                    chunks = writer.failed(shutting_down())
                else:
                    chunks = await writer.finished(event)
            else:
                chunks = _piece(writer, event)
            for chunk in chunks:
                yield chunk
            if last:
                return
            event = await anext(events, None)
    finally:
        events.handle.cancel()


def _piece(writer: ReplyWriter, event: Event) -> Iterable[bytes]:
    """The writer's bytes for an event before the end."""
    if isinstance(event, TokenEvent):
        return writer.token(event.text)
    if isinstance(event, ReasoningEvent):
        return writer.reasoning(event.text)
    if isinstance(event, ToolCallEvent):
        return writer.tool_call(event.call)
    if isinstance(event, ProgressEvent):
        return writer.progress(event)
    return ()
