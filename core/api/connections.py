"""Connections: a bounded number of them, none kept waiting for its request head for long.

uvicorn's h11 protocol reads a request head with no time limit (its keep-alive timer
runs only between requests, and the first byte of a head stops it), and asyncio accepts
every connection it can: 2,100 connections that each sent half a request head took a
server to its 2,048 file descriptors, after which nobody was answered, and asyncio
logged every refused accept with a traceback (540 MB of log in two minutes).
uvicorn's own ``limit_concurrency`` does not help: it counts idle connections too and
answers every *request* 503 past the limit, so idle sockets make real clients fail.

:class:`GuardedH11Protocol` (uvicorn's h11 protocol, a subclass) adds:

- a time limit on a request head (``HEAD_TIMEOUT_S``): from the connection's start, or
  from the first byte of a later head on a kept-alive connection, to the head's end;
  past it the connection is closed;
- a cap on connections (:func:`connection_cap`: ``--max-connections``, kept below the
  process's file-descriptor limit, whose soft value is raised at start where the OS
  allows): a new connection past the cap closes the connection that has waited longest
  without a request being served (a head not yet sent, a kept-alive connection, a reply
  its client does not take), so a flood of idle connections turns over its own sockets
  while real clients, which send their heads at once, get in. Only when every connection
  is serving a request is the new one refused (503, then closed);
- one log line per ``LOG_EVERY_S`` for what it closes or refuses, and for the accepts
  asyncio reports failing (:meth:`ConnectionGuard.loop_exception`), never one a connection;
- a kernel send buffer of ``SEND_BUFFER_BYTES`` per connection, so a client that stops
  reading pins little kernel memory and is seen falling behind soon.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from core.limits import MAX_CONNECTIONS

log = logging.getLogger(__name__)

HEAD_TIMEOUT_S = 10.0  # from a connection's start (or a head's first byte) to the head's end
# descriptors kept for the rest of the process (a server with a model loaded used 16)
RESERVED_FDS = 64
LOG_EVERY_S = 10.0
# The kernel's send buffer of a connection (Linux doubles it; autotuning would let it grow to
# megabytes): what a client that stops reading leaves queued in the kernel, and so how soon
# the server sees it fall behind (core.api.relay cuts it off). Ample for a local stream.
SEND_BUFFER_BYTES = 64 * 1024
ACCEPT_FAILED = "socket.accept() out of system resource"  # asyncio's message
_BUSY = (
    b'{"error": {"message": "the server is at its connection limit; try again", '
    b'"type": "server_error", "code": "busy"}}'
)
BUSY_REPLY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)
)


@dataclass(frozen=True)
class ConnectionLimits:
    """``max_connections``: the most open at once (``--max-connections``, before the
    descriptor limit caps it); ``head_timeout_s``: how long a request head may take."""

    max_connections: int = MAX_CONNECTIONS
    head_timeout_s: float = HEAD_TIMEOUT_S


# a server started without --max-connections (frozen: one can be shared)
DEFAULT_CONNECTION_LIMITS = ConnectionLimits()


def raise_open_file_limit(wanted: int) -> int:
    """Raise the soft limit on open files towards ``wanted`` (never past the hard limit,
    never lower); the soft limit in force. Where there is no such limit (Windows), ``wanted``."""
    try:
        import resource
    except ImportError:
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # macOS refuses more than kern.maxfilesperproc
            log.info("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return wanted if soft == resource.RLIM_INFINITY else soft


def connection_cap(max_connections: int) -> int:
    """The connections the server may hold: ``max_connections``, less where the process's
    file-descriptor limit (raised first, where it can be) leaves no room for them."""
    fds = raise_open_file_limit(max_connections + RESERVED_FDS)
    return max(1, min(max_connections, fds - RESERVED_FDS))


class _EveryFewSeconds:
    """Counts events and logs one line about them at most every ``LOG_EVERY_S``."""

    def __init__(self, message: str):
        self.message = message  # with {count} and {seconds}
        self.count = 0
        self.since = time.monotonic()
        self.logged_at: float | None = None

    def add(self) -> None:
        self.count += 1
        now = time.monotonic()
        if self.logged_at is None or now - self.logged_at >= LOG_EVERY_S:
            log.warning(
                self.message.format(count=f"{self.count:,}", seconds=f"{now - self.since:.0f}")
            )
            self.count, self.since, self.logged_at = 0, now, now


class ConnectionGuard:
    """The connections of one server (event loop only): which are waiting without a request
    being served (oldest first), the cap, and the log lines."""

    def __init__(self, limits: ConnectionLimits):
        self.limits = limits
        self.cap = connection_cap(limits.max_connections)
        self.open = 0
        self._waiting: collections.OrderedDict[GuardedH11Protocol, None] = collections.OrderedDict()
        self._evicted = _EveryFewSeconds(
            f"at the connection limit ({self.cap:,}): closed {{count}} idle connections to make "
            "room in the last {seconds} s (radixchat serve --max-connections N raises the limit)"
        )
        self._refused = _EveryFewSeconds(
            f"at the connection limit ({self.cap:,}) with every connection serving a request: "
            "refused {count} connections in the last {seconds} s (radixchat serve "
            "--max-connections N raises the limit)"
        )
        self._timed_out = _EveryFewSeconds(
            "closed {count} connections that sent no whole request head within "
            f"{limits.head_timeout_s:g} s (in the last {{seconds}} s)"
        )
        self._accept_failed = _EveryFewSeconds(
            "out of file descriptors: connections were not accepted {count} times in the last "
            "{seconds} s (raise the open-file limit, or lower --max-connections)"
        )

    def made(self, connection: GuardedH11Protocol) -> bool:
        """A new connection: False if it was refused (the cap is reached and every other
        connection is serving a request)."""
        self.open += 1
        if self.open > self.cap:
            oldest = next(iter(self._waiting), None)
            if oldest is None:
                self._refused.add()
                connection.refuse()
                return False
            self._evicted.add()
            oldest.drop()
        return True

    def lost(self, connection: GuardedH11Protocol) -> None:
        self.open -= 1
        self._waiting.pop(connection, None)

    def waiting(self, connection: GuardedH11Protocol, waiting: bool) -> None:
        """Whether ``connection`` waits with no request being served (its turn to be closed
        is kept from when it started waiting)."""
        if not waiting:
            self._waiting.pop(connection, None)
        elif connection not in self._waiting:
            self._waiting[connection] = None

    def timed_out(self) -> None:
        self._timed_out.add()

    def loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """The event loop's exception handler: asyncio's failed accepts (one a connection,
        each with a traceback) become one line every few seconds; the rest as asyncio has them."""
        if context.get("message") == ACCEPT_FAILED:
            self._accept_failed.add()
        else:
            loop.default_exception_handler(context)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head time limit and the guard's cap; a subclass
    per server carries its :class:`ConnectionGuard` (:func:`protocol_for`)."""

    guard: ConnectionGuard
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        if self.guard.made(self):
            self.guard.waiting(self, True)
            self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._update()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._update()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self.guard.lost(self)
        super().connection_lost(exc)

    def _update(self) -> None:
        """After bytes came in or a reply went out: waiting or serving; a head's timer."""
        serving = self.cycle is not None and not self.cycle.response_complete
        self.guard.waiting(self, not serving)  # a closing one whose reply nobody takes waits too
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            self._cancel_head_timer()  # a whole head came (or the connection is going)
        elif self._head_timer is None and self.conn.trailing_data[0]:
            self._arm_head_timer()  # the first bytes of a head on a kept-alive connection

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(
            self.guard.limits.head_timeout_s, self._head_timed_out
        )

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.guard.timed_out()
            self.drop()

    def drop(self) -> None:
        """Close now: a reply the client does not take is dropped with the connection."""
        self._cancel_head_timer()
        self.guard.waiting(self, False)
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    def refuse(self) -> None:
        """No room: a 503 and close (the client learns why rather than hanging)."""
        self.transport.write(BUSY_REPLY)
        self.transport.close()


def protocol_for(guard: ConnectionGuard) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn instantiates per connection, carrying ``guard``."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": guard})
