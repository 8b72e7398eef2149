"""A stream whose client stops reading (issue 26.4): it falls out of the decode batch instead of
holding its row until its last token."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest

from core.api.server import ApiServer
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.api.helpers import wait_for

MAX_TOKENS = 3000


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("relay")
    model = write_tiny_model(
        root / "tiny", TinyModelSpec(num_layers=2, max_position_embeddings=4096)
    )
    eng = Engine(
        root / "data", str(model), config=EngineConfig(pool_tokens=16384, disk_cache=False)
    ).start()
    eng.wait_ready(timeout=60)
    yield eng
    eng.shutdown()


def stream_request(port: int, max_tokens: int) -> bytes:
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "keep talking"}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
        b"Content-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (port, len(body), body)
    )


def in_flight(server) -> int:
    """The requests the server is serving now, as its /metrics says."""
    with urllib.request.urlopen(server.address + "/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("radixchat_requests_in_flight "):
                return int(float(line.split()[1]))
    raise AssertionError("no radixchat_requests_in_flight in /metrics")


@pytest.mark.faults
def test_a_stream_whose_client_stops_reading_is_cut_off_and_gives_its_row_back(engine):
    with ApiServer(engine, "127.0.0.1", 0) as server:
        server.state.max_unsent_events = 8
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for it
        sock.settimeout(30)
        try:
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(stream_request(server.port, MAX_TOKENS))
            received = sock.recv(4096)
            assert received.startswith(b"HTTP/1.1 200")
            # stop reading: the engine goes on until the server sees the client fall behind
            assert wait_for(lambda: in_flight(server) == 0)
            sock.settimeout(10)
            while chunk := sock.recv(65536):
                received += chunk
        finally:
            sock.close()
    text = received.decode(errors="replace")
    assert "the client stopped reading" in text and "[DONE]" not in text
    tokens = text.count('"content":') - 1  # the first chunk carries the role
    assert tokens < MAX_TOKENS


def test_a_client_that_reads_gets_its_whole_stream(engine):
    with ApiServer(engine, "127.0.0.1", 0) as server:
        # small, yet with room for the event loop to lag the engine thread by a few tokens on
        # a loaded machine (at 8, a reading client was cut off once with the load at 8 on 2 cores)
        server.state.max_unsent_events = 64
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
            sock.sendall(stream_request(server.port, 400))
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
    assert b"data: [DONE]" in received
    assert b"stopped reading" not in received
