"""The commands on the engine thread's queue besides requests (a :class:`RequestHandle`
is queued as itself): what a client asks of the thread that owns the model. The engine
carries each out by its handler in one table (``Engine.apply``); a sharded engine
(:mod:`core.distributed.engine`) sends each in a tick that every rank of its group applies
alike, through the same table.

A command's inputs are the fields it is made with; what the engine answers are fields
made with ``init=False`` (a ``done`` event the engine sets once it has been applied, a
result). A group's other ranks get a command's inputs, every one of them
(``core.distributed.wire.command_to_dict``), never its answers."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.engine.types import EmbeddingRequest, EmbeddingResult
from core.errors import ModelLoadError

if TYPE_CHECKING:  # core.models.load.loader imports mlx: only the engine thread loads it
    from core.models.load.loader import ModelInfo


@dataclass
class LoadCommand:
    """Load the model ``spec`` (waits until the running requests are done). The engine
    sets ``info`` (loaded) or ``error`` (one line for the user), then ``done``."""

    spec: str
    weights_format: str
    done: threading.Event = field(default_factory=threading.Event, init=False)
    info: ModelInfo | None = field(default=None, init=False)
    error: str | None = field(default=None, init=False)


@dataclass
class FlushCommand:
    """Write out what the disk tier still holds for disk, then set ``done``."""

    done: threading.Event = field(default_factory=threading.Event, init=False)


@dataclass
class ForgetCommand:
    """Drop the cache of ``session`` of cache namespace ``namespace``: RAM and disk."""

    session: str
    namespace: str = ""


@dataclass
class GiveWayCommand:
    """The disk is full: delete the disk cache and start an empty one; ``freed`` is the
    bytes given back when ``done`` is set."""

    done: threading.Event = field(default_factory=threading.Event, init=False)
    freed: int = field(default=0, init=False)


@dataclass
class EmbedCommand:
    """Embed ``tokens``: ``request``'s inputs as token ids, worked out on the client's
    thread for the model of the engine's ``load``-th load (a model loaded since works them
    out again). The engine runs it a forward pass at a time between decode steps
    (:func:`core.engine.embedding.advance`), keeping its progress in ``job`` (engine thread
    only), then sets ``result``, or ``error`` (a UserError for the user; any other
    exception is a bug, already logged), then ``done``."""

    request: EmbeddingRequest
    tokens: list[list[int]]
    load: int
    done: threading.Event = field(default_factory=threading.Event, init=False)
    result: EmbeddingResult | None = field(default=None, init=False)
    error: Exception | None = field(default=None, init=False)
    job: object | None = field(default=None, init=False)

    def answer(self, stopped: threading.Event) -> EmbeddingResult:
        """Wait for the engine: the result, or its error raised (a ModelLoadError if the
        engine stops first)."""
        while not self.done.wait(0.5):
            if stopped.is_set():
                raise ModelLoadError("the engine has stopped")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


@dataclass(frozen=True)
class StopCommand:
    """Finish the running requests, drop the model and the cache, park the engine thread."""


# Applied only once the running requests are done (a command queued behind them waits).
WHEN_IDLE = (LoadCommand, StopCommand)
