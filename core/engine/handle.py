"""A submitted request as both sides hold it: the client's events and cancel switch, and the
engine's way to send events and end the stream. Plain Python: no mlx here."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from core.engine.types import Event, GenerationRequest

_END = object()  # end of a request's event stream


@dataclass(frozen=True)
class PreparedPrompt:
    """A request's prompt as a prompt thread worked it out: its token ids, for the model
    of the engine's ``load``-th load (a model loaded since needs them worked out again)."""

    load: int
    tokens: list[int]


class RequestHandle:
    """One submitted request: the client's side (its events, a cancel switch) and the
    engine's (:meth:`emit`, :meth:`finish`, ``prepared``).

    A thread reads the events with :meth:`events` (blocking). An event loop instead asks
    to be woken (:meth:`on_events`) and takes what has arrived with :meth:`take`, so no
    thread per request is needed to carry the tokens across.

    The engine side is what the scheduler needs of a request: ``request``, ``cancelled``,
    ``prompt_s``, :meth:`emit` and :meth:`finish` (a sharded engine's
    :class:`core.distributed.engine.ShardHandle` offers the same)."""

    def __init__(self, request: GenerationRequest):
        self.request = request  # as submitted; the engine admits it carrying its token ids
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._cancel = threading.Event()
        self._wake: Callable[[], None] | None = None
        # set by a prompt thread, taken by the engine thread
        self.prepared: PreparedPrompt | None = None
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
