"""A group of processes (one per machine) running one model, and rank 0's line to the others.

``mlx.launch`` starts one process per host with ``MLX_RANK`` and ``MLX_HOSTFILE`` (the
ring's ``ip:port`` of every rank) in its environment; :func:`join_group` opens MLX's ring
group and, beside it, a control channel: a TCP connection from every rank to rank 0, on
rank 0's ring address and a port rank 0 picked and told the others over the ring.

The ring carries the model's collectives; the control channel carries rank 0's decisions
(:mod:`core.distributed.engine`) and heartbeats both ways, with timeouts, so that a rank
that dies or cannot be reached is noticed even while the others are blocked inside an MLX
collective (which has no timeout of its own):

- a rank that dies closes its sockets: its peers see the channel close at once;
- a host that stops answering (cable out, asleep) sends no heartbeat: after
  ``SILENCE_S`` its peers give up on it;
- a rank whose engine fails says so on the channel before it exits.

Each side reports the first such fault once, through ``on_fault(message)``; the message
names the rank and its host.

The channel is authenticated: ``radixchat serve --hosts`` makes a random secret for each
launch and hands it to every rank in its environment (``RADIXCHAT_GROUP_SECRET``, never on
a rank's command line). A rank that connects answers rank 0's random challenge with an
HMAC of it under the secret, and rank 0 answers the rank's challenge in turn (so a rank
knows it reached rank 0); a connection that fails is dropped with one line in the log,
and rank 0 goes on waiting for the real rank. Nothing is read from a peer before it has
proved itself but a small handshake message.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from queue import Queue
from typing import Any

from core.distributed.wire import HANDSHAKE_MAX, ChannelClosed, recv_message, send_message
from core.errors import UserError

log = logging.getLogger(__name__)

BEAT_S = 1.0  # a heartbeat this often, each way
SILENCE_S = 10.0  # a peer silent this long is gone
CONNECT_S = 60.0  # the other ranks must join within this (they load nothing before)
HANDSHAKE_S = 5.0  # a connection must prove itself within this
HOSTS_ENV = "RADIXCHAT_GROUP_HOSTS"  # the hosts' names, rank by rank (JSON), for messages
SECRET_ENV = "RADIXCHAT_GROUP_SECRET"  # this launch's secret (hex), in every rank's environment


class GroupError(UserError):
    """The group could not be formed (no ring backend, a rank that never joined)."""


@dataclass(frozen=True)
class Membership:
    """This process's place in the group (plain values)."""

    rank: int
    world: int
    hosts: tuple[str, ...]  # a name for each rank's host, for messages

    def name(self, rank: int) -> str:
        return f"rank {rank} ({self.hosts[rank]})"

    @property
    def leader(self) -> bool:
        return self.rank == 0


def ring_addresses(text: str) -> list[str]:
    """The host of each rank from MLX's ring hostfile (``[["ip:port", ...], ...]``)."""
    return [entries[0].rsplit(":", 1)[0] for entries in json.loads(text)]


def launched_backend(environ) -> str | None:
    """The backend ``mlx.launch`` started this rank for (None: not started by it)."""
    if environ.get("MLX_JACCL_COORDINATOR"):
        return "jaccl"
    return "ring" if environ.get("MLX_HOSTFILE") else None


def new_secret() -> str:
    """A fresh secret for one launch of a group."""
    return secrets.token_hex(32)


def _proof(secret: str, role: str, challenge: str, rank: int) -> str:
    """What a peer in ``role`` answers to ``challenge``: an HMAC under the group's secret,
    bound to the role and the rank, so an answer cannot be replayed the other way."""
    text = f"radixchat-group/1 {role} {rank} {challenge}".encode()
    return hmac.new(bytes.fromhex(secret), text, hashlib.sha256).hexdigest()


def _check_proof(secret: str, role: str, challenge: str, rank: int, proof: object) -> bool:
    return isinstance(proof, str) and hmac.compare_digest(
        _proof(secret, role, challenge, rank), proof
    )


def join_group(on_fault: Callable[[str], None]):
    """Open MLX's ring group and the control channel; returns ``(mlx_group, channel)``,
    the channel a :class:`LeaderChannel` on rank 0, a :class:`FollowerChannel` elsewhere."""
    import mlx.core as mx

    backend = launched_backend(os.environ)
    if backend is None:
        raise GroupError("not started as a group: run `radixchat serve --hosts HOSTFILE`")
    secret = os.environ.pop(SECRET_ENV, "")  # popped: nothing this rank starts inherits it
    try:
        bytes.fromhex(secret)
    except ValueError:
        secret = ""
    if not secret:
        raise GroupError(
            f"no group secret in ${SECRET_ENV}: run `radixchat serve --hosts HOSTFILE`"
        )
    try:
        group = mx.distributed.init(strict=True, backend=backend)
    except (RuntimeError, ValueError) as exc:
        raise GroupError(f"cannot join the {backend} group: {exc}") from exc
    if backend == "ring":
        with open(os.environ["MLX_HOSTFILE"]) as f:
            addresses = ring_addresses(f.read())
    else:  # JACCL: rank 0's address is its coordinator's
        addresses = [os.environ["MLX_JACCL_COORDINATOR"].rsplit(":", 1)[0]] * group.size()
    names = (
        tuple(json.loads(os.environ[HOSTS_ENV])) if os.environ.get(HOSTS_ENV) else tuple(addresses)
    )
    member = Membership(group.rank(), group.size(), names)
    listener = None
    if member.leader:
        listener = socket.create_server((addresses[0], 0))
        port = listener.getsockname()[1]
    else:
        port = 0
    # rank 0's port to every rank (a sum where only rank 0 adds anything)
    port = int(
        mx.distributed.all_sum(mx.array([port], dtype=mx.int32), group=group, stream=mx.cpu).item()
    )
    if member.leader:
        channel = LeaderChannel(member, listener, on_fault, secret)
    else:
        channel = FollowerChannel(member, (addresses[0], port), on_fault, secret)
    return group, channel


class _Faults:
    """The first fault, reported once."""

    def __init__(self, on_fault: Callable[[str], None]):
        self._on_fault = on_fault
        self._lock = threading.Lock()
        self.message: str | None = None
        self.closing = False  # the group is stopping: peers leaving is no fault

    def report(self, message: str) -> None:
        with self._lock:
            if self.message is not None or self.closing:
                return
            self.message = message
        log.error("%s", message)
        self._on_fault(message)


class LeaderChannel:
    """Rank 0's side: broadcasts decisions, watches every other rank."""

    def __init__(
        self,
        member: Membership,
        listener: socket.socket,
        on_fault: Callable[[str], None],
        secret: str,
    ):
        self.member = member
        self.faults = _Faults(on_fault)
        # what another rank reports (other than heartbeats and faults), from its watch thread
        self.on_message: Callable[[int, dict[str, Any]], None] = lambda rank, message: None
        self._send_lock = threading.Lock()
        self._peers: dict[int, socket.socket] = {}
        self._gone: dict[int, threading.Event] = {}  # set when a rank has stopped (or is gone)
        listener.settimeout(CONNECT_S)
        try:
            while len(self._peers) < member.world - 1:
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    missing = [
                        member.name(r) for r in range(1, member.world) if r not in self._peers
                    ]
                    raise GroupError(
                        f"{', '.join(missing)} never joined the control channel"
                    ) from None
                rank = self._admit(conn, secret)
                if rank is None:
                    conn.close()
                    continue
                conn.settimeout(SILENCE_S)
                self._peers[rank] = conn
        finally:
            listener.close()
        for rank, conn in self._peers.items():
            self._gone[rank] = threading.Event()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(
                target=self._watch,
                args=(rank, conn),
                daemon=True,
                name=f"radixchat-watch-rank{rank}",
            ).start()
        threading.Thread(target=self._beat, daemon=True, name="radixchat-beat").start()

    def _admit(self, conn: socket.socket, secret: str) -> int | None:
        """The rank ``conn`` proved it is (challenge, answer, then rank 0's own proof), or
        None, logged in one line, for anything else."""
        try:
            host, port = conn.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "a peer"
        conn.settimeout(HANDSHAKE_S)
        challenge = secrets.token_hex(32)
        try:
            send_message(conn, {"op": "challenge", "challenge": challenge})
            hello = recv_message(conn, HANDSHAKE_MAX)
            rank = hello.get("rank")
            valid = (
                hello.get("op") == "hello"
                and isinstance(rank, int)
                and 0 < rank < self.member.world
                and rank not in self._peers
                and isinstance(hello.get("challenge"), str)
                and _check_proof(secret, "rank", challenge, rank, hello.get("proof"))
            )
            if not valid:
                log.warning(
                    "the group's control channel refused %s: it did not prove it is a rank of "
                    "this group (wrong secret or not a RadixChat rank)",
                    peer,
                )
                return None
            send_message(
                conn, {"op": "welcome", "proof": _proof(secret, "leader", hello["challenge"], rank)}
            )
            return rank
        except (OSError, ValueError, AttributeError) as exc:  # timeouts, garbage, a closed socket
            log.warning(
                "the group's control channel refused %s: no valid handshake (%s)", peer, exc
            )
            return None

    def broadcast(self, message: dict[str, Any]) -> None:
        """Send ``message`` to every other rank (a broken peer is a fault, reported)."""
        if message.get("op") == "stop":
            self.faults.closing = True
        with self._send_lock:
            for rank, conn in self._peers.items():
                try:
                    send_message(conn, message)
                except OSError as exc:
                    self.faults.report(f"{self.member.name(rank)} cannot be reached: {exc}")

    def wait_stopped(self, timeout: float = 60.0) -> None:
        """After "stop": until every rank has flushed its cache and said so (or is gone).
        Rank 0 must not exit before: its sockets would reset, and a reset drops what a
        rank has not read yet, the stop among it."""
        deadline = time.monotonic() + timeout
        for gone in self._gone.values():
            gone.wait(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """After :meth:`wait_stopped`: close the connections to the other ranks."""
        for conn in self._peers.values():
            conn.close()

    def _beat(self) -> None:
        while self.faults.message is None and not self.faults.closing:
            self.broadcast({"op": "beat"})
            time.sleep(BEAT_S)

    def _watch(self, rank: int, conn: socket.socket) -> None:
        try:
            self._read_from(rank, conn)
        finally:
            self._gone[rank].set()

    def _read_from(self, rank: int, conn: socket.socket) -> None:
        name = self.member.name(rank)
        while True:
            message = _receive(conn, name, self.faults)
            if message is None:
                return
            if message.get("op") == "fault":
                self.faults.report(f"{name} failed: {message.get('error')}")
                return
            if message.get("op") == "stopped":
                return
            if message.get("op") != "beat":
                self.on_message(rank, message)


def _receive(sock: socket.socket, name: str, faults: _Faults) -> dict | None:
    """The next message from ``name`` over ``sock``; None once it went silent or left (the
    fault reported)."""
    try:
        return recv_message(sock)
    except TimeoutError:
        faults.report(f"{name} stopped answering (nothing for {SILENCE_S:.0f} s)")
    except (ChannelClosed, OSError) as exc:
        faults.report(f"{name} left the group ({exc})")
    return None


class FollowerChannel:
    """Another rank's side: receives rank 0's decisions in order, sends heartbeats."""

    def __init__(
        self,
        member: Membership,
        leader: tuple[str, int],
        on_fault: Callable[[str], None],
        secret: str,
    ):
        self.member = member
        self.faults = _Faults(on_fault)
        self._send_lock = threading.Lock()
        self._inbox: Queue = Queue()
        self._sock = socket.create_connection(leader, timeout=CONNECT_S)
        self._handshake(secret)
        self._sock.settimeout(SILENCE_S)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=self._read, daemon=True, name="radixchat-leader-reader").start()
        threading.Thread(target=self._beat, daemon=True, name="radixchat-beat").start()

    def _handshake(self, secret: str) -> None:
        """Answer rank 0's challenge; check its answer to ours (:class:`GroupError` if not)."""
        name, rank = self.member.name(0), self.member.rank
        challenge = secrets.token_hex(32)
        try:
            asked = recv_message(self._sock, HANDSHAKE_MAX)
            send_message(
                self._sock,
                {
                    "op": "hello",
                    "rank": rank,
                    "challenge": challenge,
                    "proof": _proof(secret, "rank", str(asked.get("challenge")), rank),
                },
            )
            welcome = recv_message(self._sock, HANDSHAKE_MAX)
        except (OSError, ValueError, AttributeError) as exc:
            self._sock.close()
            raise GroupError(
                f"{name} refused this rank on the control channel (a different "
                f"launch's secret?): {exc}"
            ) from None
        if not _check_proof(secret, "leader", challenge, rank, welcome.get("proof")):
            self._sock.close()
            log.warning(
                "the group's control channel: %s did not prove it is this group's rank 0", name
            )
            raise GroupError(f"{name} did not prove it belongs to this group (wrong secret)")

    def receive(self) -> dict[str, Any]:
        """Rank 0's next decision (blocks; heartbeats are taken out)."""
        return self._inbox.get()

    def send(self, message: dict[str, Any]) -> None:
        """Tell rank 0 ``message`` (a channel that broke is a fault, reported)."""
        try:
            self._send(message)
        except OSError as exc:
            self.faults.report(f"{self.member.name(0)} cannot be reached: {exc}")

    def report_fault(self, error: str) -> None:
        """This rank failed: tell rank 0 (best effort), then report it here."""
        try:
            self._send({"op": "fault", "error": error})
        except OSError:
            pass
        self.faults.report(f"{self.member.name(self.member.rank)} failed: {error}")

    def close(self) -> None:
        """After rank 0's stop: close the connection to it."""
        self._sock.close()

    def _send(self, message: dict[str, Any]) -> None:
        with self._send_lock:
            send_message(self._sock, message)

    def _beat(self) -> None:
        while self.faults.message is None and not self.faults.closing:
            try:
                self._send({"op": "beat"})
            except OSError as exc:
                self.faults.report(f"{self.member.name(0)} cannot be reached: {exc}")
                return
            time.sleep(BEAT_S)

    def _read(self) -> None:
        name = self.member.name(0)
        while True:
            message = _receive(self._sock, name, self.faults)
            if message is None:
                return
            if message.get("op") == "stop":
                self.faults.closing = True
            if message.get("op") != "beat":
                self._inbox.put(message)
            if self.faults.closing:
                return
