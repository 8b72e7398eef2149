"""A submitted request as both sides hold it: the client's events and cancel switch, and the
engine's way to send events and end the stream. Plain Python: no mlx here."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from core.engine.types import Event, GenerationRequest

_END = object()  # end of a request's event stream


@dataclass(frozen=True)
class TokenizedRequest:
    """A request with its prompt worked out (on a prompt thread, or a group's engine thread):
    the token ids the model reads (the chat template rendered, Ollama's ``context`` before
    them), for the model of the engine's ``load``-th load (a model loaded since needs them
    worked out again). The scheduler admits this; it never renders a prompt itself."""

    request: GenerationRequest
    tokens: tuple[int, ...]
    load: int

    @property
    def templated(self) -> bool:
        """The ids were rendered from chat messages by the chat template (so a reasoning
        model's thinking is split out of the reply; a raw text or token prompt is not)."""
        return bool(self.request.messages)


def tokenize(request: GenerationRequest, prompts) -> TokenizedRequest:
    """``request`` with its prompt worked out by ``prompts`` (a
    :class:`core.engine.prompt.Prompts` of the loaded model): ContextLengthError past the
    limit, UserError if empty."""
    return TokenizedRequest(request, tuple(prompts.tokens(request)), prompts.load)


@runtime_checkable
class EngineHandle(Protocol):
    """A request as the engine and its scheduler hold it: :class:`RequestHandle` on one
    engine, :class:`core.distributed.engine.ShardHandle` on each rank of a group."""

    request: GenerationRequest
    tokenized: TokenizedRequest | None  # set once its prompt is worked out
    prompt_s: float  # seconds its prompt took to render and tokenise

    @property
    def cancelled(self) -> bool: ...

    def emit(self, event: Event) -> None: ...

    def finish(self) -> None: ...


class RequestHandle:
    """One submitted request: the client's side (its events, a cancel switch) and the
    engine's (:meth:`emit`, :meth:`finish`, ``tokenized``: an :class:`EngineHandle`).

    A thread reads the events with :meth:`events` (blocking). An event loop instead asks
    to be woken (:meth:`on_events`) and takes what has arrived with :meth:`take`, so no
    thread per request is needed to carry the tokens across.

    The engine side is what the scheduler needs of a request: ``request``, ``cancelled``,
    ``prompt_s``, :meth:`emit` and :meth:`finish` (a sharded engine's
    :class:`core.distributed.engine.ShardHandle` offers the same)."""

    def __init__(self, request: GenerationRequest):
        self.request = request  # as submitted
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._cancel = threading.Event()
        self._wake: Callable[[], None] | None = None
        # set by a prompt thread, taken by the engine thread
        self.tokenized: TokenizedRequest | None = None
        self.prompt_s = 0.0  # seconds its prompt took to render and tokenise (its TTFT counts them)

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Events until the request ends (a DoneEvent or an ErrorEvent comes last)."""
        while True:
            item = self._events.get(timeout=timeout)
            if item is _END:
                return
            yield item

    def on_events(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` whenever events arrive (on the engine thread, or the prompt thread
        that refuses the request: it must be quick and never block), and once now if some are
        already waiting. Then read with :meth:`take`."""
        self._wake = wake
        if not self._events.empty():
            wake()

    def take(self) -> tuple[list[Event], bool]:
        """The events that have arrived, without waiting; and whether the stream has ended
        (nothing comes after)."""
        taken: list[Event] = []
        while True:
            try:
                item = self._events.get_nowait()
            except queue.Empty:
                return taken, False
            if item is _END:
                return taken, True
            taken.append(item)

    # engine side
    def emit(self, event: Event) -> None:
        """Send ``event`` to the client (the engine thread, or a prompt thread refusing
        the request)."""
        self._events.put(event)
        if self._wake is not None:
            self._wake()

    def finish(self) -> None:
        """End the stream: nothing is emitted after this."""
        self._events.put(_END)
        if self._wake is not None:
            self._wake()
