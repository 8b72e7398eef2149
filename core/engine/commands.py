"""The commands on the engine thread's queue besides requests (a :class:`RequestHandle`
is queued as itself): what a client asks of the thread that owns the model. The engine
applies them in its loop; a sharded engine (:mod:`core.distributed.engine`) turns each
into a tick every rank of its group applies alike. A command that answers carries a
``done`` event the engine sets once it has been applied."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # core.models.load.loader imports mlx: only the engine thread loads it
    from core.models.load.loader import ModelInfo


@dataclass
class LoadCommand:
    """Load the model ``spec`` (waits until the running requests are done). The engine
    sets ``info`` (loaded) or ``error`` (one line for the user), then ``done``."""

    spec: str
    weights_format: str
    done: threading.Event = field(default_factory=threading.Event)
    info: ModelInfo | None = None
    error: str | None = None


@dataclass
class FlushCommand:
    """Write out what the disk tier still holds for disk, then set ``done``."""

    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class ForgetCommand:
    """Drop the cache of ``session`` of cache namespace ``namespace``: RAM and disk."""

    session: str
    namespace: str = ""


@dataclass
class GiveWayCommand:
    """The disk is full: delete the disk cache and start an empty one; ``freed`` is the
    bytes given back when ``done`` is set."""

    done: threading.Event = field(default_factory=threading.Event)
    freed: int = 0


@dataclass(frozen=True)
class StopCommand:
    """Finish the running requests, drop the model and the cache, park the engine thread."""
