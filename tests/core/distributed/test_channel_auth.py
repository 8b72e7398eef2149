"""The control channel admits only ranks of this launch: an HMAC challenge-response under
the launch's secret, both ways; anything else is dropped with one line in the log."""

from __future__ import annotations

import logging
import socket
import struct
import threading

import pytest

from core.distributed.group import (
    FollowerChannel,
    GroupError,
    LeaderChannel,
    Membership,
    join_group,
    new_secret,
)
from core.distributed.wire import recv_message, send_message

HOSTS = ("studio.local", "macbook.local")


class Leader:
    """Rank 0's channel being formed on a loopback port, in a thread (it waits for rank 1)."""

    def __init__(self, secret: str):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.faults: list[str] = []
        self.channel: LeaderChannel | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._form, args=(secret,), daemon=True)
        self.thread.start()

    def _form(self, secret: str) -> None:
        try:
            self.channel = LeaderChannel(
                Membership(0, 2, HOSTS), self.listener, self.faults.append, secret
            )
        except BaseException as exc:  # handed to the test
            self.error = exc

    def joined(self, timeout: float = 30) -> LeaderChannel:
        self.thread.join(timeout)
        assert self.error is None and self.channel is not None, self.error
        return self.channel


def follower(address, secret: str) -> FollowerChannel:
    return FollowerChannel(Membership(1, 2, HOSTS), address, [].append, secret)


def stop(leader: LeaderChannel, rank1: FollowerChannel) -> None:
    leader.broadcast({"op": "stop"})
    assert rank1.receive() == {"op": "stop"}
    rank1.send({"op": "stopped"})
    leader.wait_stopped(10)
    leader.close()
    rank1.close()


def test_a_wrong_secret_is_refused_and_the_real_rank_still_joins(caplog):
    secret = new_secret()
    leader = Leader(secret)
    with caplog.at_level(logging.WARNING, logger="core.distributed.group"):
        with pytest.raises(GroupError, match="refused this rank"):
            follower(leader.address, new_secret())  # another launch's secret
        refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 1 and "\n" not in refused[0] and "127.0.0.1:" in refused[0]
        rank1 = follower(leader.address, secret)
    channel = leader.joined()
    channel.broadcast({"op": "admit", "id": 1})
    assert rank1.receive() == {"op": "admit", "id": 1}
    stop(channel, rank1)
    assert leader.faults == []


def test_a_peer_that_sends_no_proof_is_dropped(caplog):
    secret = new_secret()
    leader = Leader(secret)
    with caplog.at_level(logging.WARNING, logger="core.distributed.group"):
        # knows the protocol, not the secret
        with socket.create_connection(leader.address) as intruder:
            challenge = recv_message(intruder)
            assert challenge["op"] == "challenge"
            send_message(intruder, {"op": "hello", "rank": 1, "challenge": "00", "proof": "0" * 64})
            assert intruder.recv(16) == b""  # dropped, never welcomed
        with socket.create_connection(leader.address) as flood:  # a huge message before any proof
            recv_message(flood)
            flood.sendall(struct.pack(">I", 1 << 30))
            assert flood.recv(16) == b""
        rank1 = follower(leader.address, secret)
        channel = leader.joined()
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 2
    stop(channel, rank1)


def test_a_rank_refuses_a_rank_0_without_the_secret():
    secret = new_secret()
    with socket.create_server(("127.0.0.1", 0)) as fake:

        def pretend():  # a listener that plays rank 0 without knowing the secret
            conn, _ = fake.accept()
            with conn:
                send_message(conn, {"op": "challenge", "challenge": "ab" * 32})
                recv_message(conn)
                send_message(conn, {"op": "welcome", "proof": "0" * 64})
                conn.recv(16)

        thread = threading.Thread(target=pretend, daemon=True)
        thread.start()
        with pytest.raises(GroupError, match="wrong secret"):
            follower(fake.getsockname(), secret)
        thread.join(10)


def test_a_rank_without_a_secret_does_not_join(monkeypatch):
    monkeypatch.setenv("MLX_HOSTFILE", "/nonexistent")
    monkeypatch.delenv("RADIXCHAT_GROUP_SECRET", raising=False)
    with pytest.raises(GroupError, match="no group secret"):
        join_group(lambda message: None)
