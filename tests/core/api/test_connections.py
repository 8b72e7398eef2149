"""A flood of connections (issue 26.3): request heads that never end, more connections than
file descriptors, and the log lines they cost."""

from __future__ import annotations

import http.client
import json
import logging
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.server_process import (
    REPO_ROOT,
    free_port,
    radixchat_server_code,
    wait_until_answers,
)
from core.api.server import ApiServer

HALF_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "  # never ends


def half_heads(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that each send half a request head and hold (those the server
    refuses or closes at once stay in the list: the client does not know yet)."""
    held = []
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(10)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(HALF_HEAD)
        except OSError:
            pass
        held.append(sock)
    return held


def answer(
    port: int,
    method: str = "GET",
    path: str = "/health",
    body: dict | None = None,
    timeout: float = 15.0,
) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, data, {"Content-Type": "application/json"} if data else {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def closed_by_server(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Whether the server closes ``sock`` within ``timeout`` (what it still sends first is read)."""
    deadline = time.monotonic() + timeout
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if sock.recv(65536) == b"":
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        pass
    return False


@pytest.fixture
def many_sockets():
    """Room in this process for a few thousand sockets (mlx-lm sets 2,048 when imported)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.faults
def test_more_idle_connections_than_descriptors_leave_the_server_answering(
    tiny_model, tmp_path, many_sockets
):
    """Issue 26.3: 2,100 half-sent request heads took the server to its descriptor limit
    (2,048: what mlx-lm sets when imported) and nobody was answered while they were held;
    every refused accept was logged with a traceback. Now the oldest idle connection makes
    room for a new one, and the log has a line every few seconds."""
    port = free_port()
    log_path = tmp_path / "serve.log"
    code = radixchat_server_code(str(tiny_model), tmp_path / "data", port, 4096)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with log_path.open("wb") as log_file:
        server = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    held: list[socket.socket] = []
    try:
        assert wait_until_answers(server, port, "/health", 120), log_path.read_text()[-2000:]
        held = half_heads(port, 2100)
        assert answer(port) == 200
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
        assert answer(port, "POST", "/v1/chat/completions", chat) == 200
    finally:
        for sock in held:
            sock.close()
        server.terminate()
        server.wait(30)
    log = log_path.read_text(errors="replace")
    assert len(log) < 20_000, log[-3000:]
    assert "Traceback" not in log and "at the connection limit" in log


def limited_server(engine, max_connections: int = 1000, head_timeout_s: float = 30.0) -> ApiServer:
    from core.api.connections import ConnectionLimits

    return ApiServer(
        engine, "127.0.0.1", 0, connections=ConnectionLimits(max_connections, head_timeout_s)
    )


@pytest.mark.faults
def test_a_request_head_has_a_time_limit(tiny_engine):
    with limited_server(tiny_engine, head_timeout_s=0.5) as server:
        check_head_time_limit(server)


def check_head_time_limit(tiny_server):
    fresh = half_heads(tiny_server.port, 1)[0]
    kept = socket.create_connection(("127.0.0.1", tiny_server.port), timeout=10)
    try:
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(1.0)  # kept alive past the head limit, with no bytes of a new head: still open
        kept.sendall(HALF_HEAD)  # now a head that never ends
        assert closed_by_server(fresh) and closed_by_server(kept)
    finally:
        fresh.close()
        kept.close()


@pytest.mark.faults
def test_past_the_cap_the_connection_idle_longest_is_closed(tiny_engine):
    with limited_server(tiny_engine, max_connections=6) as server:
        check_cap(server)


def check_cap(tiny_server):
    idle = [socket.create_connection(("127.0.0.1", tiny_server.port), timeout=10) for _ in range(6)]
    try:
        assert answer(tiny_server.port) == 200  # a seventh connection: the first idle one made room
        assert closed_by_server(idle[0], timeout=5)
        assert all(not closed_by_server(sock, timeout=0.2) for sock in idle[2:])
    finally:
        for sock in idle:
            sock.close()


class FakeConnection:
    def __init__(self):
        self.refused = self.dropped = False

    def refuse(self) -> None:
        self.refused = True

    def drop(self) -> None:
        self.dropped = True


def test_with_every_connection_serving_a_new_one_is_refused_and_logged_once(caplog):
    from core.api.connections import ConnectionGuard, ConnectionLimits

    guard = ConnectionGuard(ConnectionLimits(max_connections=2))
    serving = [FakeConnection(), FakeConnection()]
    for connection in serving:
        assert guard.made(connection)
        guard.waiting(connection, False)
    caplog.set_level(logging.WARNING, "core.api.connections")
    extra = [FakeConnection() for _ in range(50)]
    assert not any(guard.made(connection) for connection in extra)
    assert all(connection.refused for connection in extra) and not any(c.dropped for c in serving)
    assert len(caplog.records) == 1 and "--max-connections" in caplog.records[0].getMessage()
    for connection in extra:
        guard.lost(connection)
    guard.waiting(serving[0], True)  # its reply went out: it waits now, and is the one to go
    newcomer = FakeConnection()
    assert guard.made(newcomer) and serving[0].dropped and not newcomer.refused


@pytest.mark.faults
def test_failed_accepts_are_one_line_every_few_seconds(caplog):
    """asyncio reports every accept that fails for want of a descriptor, with a traceback."""
    import asyncio

    from core.api.connections import ACCEPT_FAILED, ConnectionGuard, ConnectionLimits

    guard = ConnectionGuard(ConnectionLimits())
    caplog.set_level(logging.WARNING)
    loop = asyncio.new_event_loop()
    try:
        loop.set_exception_handler(guard.loop_exception)
        for _ in range(2000):
            loop.call_exception_handler(
                {"message": ACCEPT_FAILED, "exception": OSError(24, "Too many open files")}
            )
    finally:
        loop.close()
    assert len(caplog.records) == 1 and "out of file descriptors" in caplog.records[0].getMessage()


def test_the_open_file_limit_is_raised_where_it_can_be(tmp_path):
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096)); "
        "from core.api.connections import connection_cap; "
        "print(connection_cap(1000), resource.getrlimit(resource.RLIMIT_NOFILE)[0]); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)); print(connection_cap(1000))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=Path(REPO_ROOT),
    )
    assert done.returncode == 0, done.stderr
    raised, capped = done.stdout.split("\n")[:2]
    assert raised == "1000 1064"  # room for 1,000 connections and the rest of the process
    assert capped == "192"  # the hard limit stays: fewer connections, below it
