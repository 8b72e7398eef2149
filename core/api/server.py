"""The HTTP API over the engine: FastAPI on uvicorn, on a thread of its own.

    server = ApiServer(engine, "127.0.0.1", 0).start()   # port 0: any free port
    print(server.address)                                # http://127.0.0.1:54321
    ...
    server.stop()

Endpoints (the schema is served at ``/openapi.json``): ``GET /health``, ``GET /v1/models``
(and ``/v1/models/{id}``), OpenAI's ``POST /v1/chat/completions`` and
``POST /v1/completions``, the Responses API's ``POST /v1/responses`` (``GET`` and
``DELETE /v1/responses/{id}``), Anthropic's ``POST /v1/messages`` and
``POST /v1/messages/count_tokens`` (JSON or server-sent events), Ollama's ``/api/*`` and
``GET /`` (NDJSON or JSON), ``GET /metrics`` (Prometheus). ``ollama_port``: the same API on
a second port too (Ollama's 11434, where apps that speak only Ollama's API look).
Each request is submitted to the engine and its events are relayed as they come
(:mod:`core.api.relay`); a client that goes away cancels its request, so the engine moves
on and frees its pages. What every request goes through first is :mod:`core.api.guard`;
the routes are :mod:`core.api.openai_routes`, :mod:`core.api.anthropic_routes`,
:mod:`core.api.responses_routes` and :mod:`core.api.ollama_routes`.
``radixchat serve`` is ``core.cli.serve``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Sequence

import uvicorn

from core.api.connections import (
    DEFAULT_CONNECTION_LIMITS,
    ConnectionGuard,
    ConnectionLimits,
    protocol_for,
)
from core.api.errors import engine_error
from core.api.guard import normalize_origin
from core.api.limits import DEFAULT_REQUEST_LIMITS, RequestLimits
from core.api.metrics import ServerMetrics
from core.api.request_log import RequestLog
from core.api.schema_checks import SchemaChecks
from core.api.state import ApiState
from core.engine.engine import Engine
from core.errors import UserError

__all__ = ["ApiServer", "check_bind", "engine_error", "is_loopback"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
KEEP_ALIVE_S = 75  # an idle keep-alive connection is closed after this long
GRACEFUL_S = 5.0  # stop(): how long running replies get to end (they are cancelled first)
# uvicorn's parts, named (pyinstaller.spec lists the modules these names import): h11, as
# pure Python as the rest (served through core.api.connections' subclass of its protocol),
# and no lifespan or websockets, which the API has no use for
UVICORN_PARTS = {"http": "h11", "loop": "asyncio", "lifespan": "off", "ws": "none"}
LISTEN_BACKLOG = 128  # also how many accepts asyncio tries in a row (each failing one is reported)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def api_keys(keys: str | Sequence[str] | None) -> tuple[str, ...]:
    """One key, several (one cache namespace each), or none, as a tuple."""
    if keys is None:
        return ()
    return (keys,) if isinstance(keys, str) else tuple(keys)


def check_bind(host: str, api_key: str | Sequence[str] | None) -> None:
    """Refuse to listen beyond loopback without an API key."""
    if not any(api_keys(api_key)) and not is_loopback(host):
        raise UserError(
            f"refusing to serve on {host} without an API key: pass --api-key KEY "
            "(or set RADIXCHAT_API_KEY), or bind to 127.0.0.1"
        )


class ApiServer:
    """The HTTP API over one engine; serves on a background thread between start() and stop()."""

    def __init__(
        self,
        engine: Engine,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | Sequence[str] | None = None,
        model_name: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        allow_origins: Sequence[str] = (),
        limits: RequestLimits = DEFAULT_REQUEST_LIMITS,
        connections: ConnectionLimits = DEFAULT_CONNECTION_LIMITS,
        aliases: Sequence[str] = (),
        ollama_port: int | None = None,
    ):
        check_bind(host, api_key)
        try:
            origins = tuple(normalize_origin(origin) for origin in allow_origins)
        except ValueError as exc:
            raise UserError(f"--allow-origin: {exc}") from None
        self.host = host
        self.port = port
        self.ollama_port = ollama_port  # None: the API on `port` only
        # Several keys: one client each, and one cache namespace each (core.engine.namespaces)
        self.state = ApiState(
            engine,
            host,
            api_keys(api_key),
            model_name,
            max_body_bytes,
            origins,
            limits,
            tuple(aliases),
        )
        self.connection_limits = connections
        self.connections: ConnectionGuard | None = None  # while serving
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def metrics(self) -> ServerMetrics:
        return self.state.metrics

    @property
    def request_log(self) -> RequestLog:
        """The last requests served (dialect, tokens, cached tokens, TTFT)."""
        return self.state.request_log

    @property
    def api_key(self) -> str | None:
        return self.state.api_key

    # ------------------------------------------------------------ lifecycle
    def start(self) -> ApiServer:
        from core.api.app import build_app  # FastAPI and the routes: imported when first served

        for port in (self.port, self.ollama_port):
            if port is not None and not 0 <= port <= 65535:
                raise UserError(f"cannot listen on port {port}: a port is 0 to 65535")
        if self.ollama_port and self.ollama_port == self.port:
            raise UserError(f"the Ollama port {self.port} is the API's port: give another")
        sock = self._listen(self.port)
        self.port = sock.getsockname()[1]
        sockets = [sock]
        if self.ollama_port is not None:
            try:
                sockets.append(self._listen(self.ollama_port))
            except UserError:
                sock.close()
                raise
            self.ollama_port = sockets[1].getsockname()[1]
        # raises the open-file limit if it must
        self.connections = ConnectionGuard(self.connection_limits)
        config = uvicorn.Config(
            build_app(self.state),
            **{**UVICORN_PARTS, "http": protocol_for(self.connections)},
            log_config=None,
            access_log=False,
            server_header=False,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=GRACEFUL_S,
            backlog=LISTEN_BACKLOG,
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._serve, args=(sockets,), name="radixchat-api", daemon=True
        )
        self._thread.start()
        while not self._uvicorn.started and self._thread.is_alive():
            time.sleep(0.01)
        if not self._uvicorn.started:
            for listening in sockets:
                listening.close()
            raise UserError(f"the API server on {self.address} failed to start (see the log)")
        log.info("API listening on %s (at most %d connections)", self.address, self.connections.cap)
        if self.ollama_address is not None:
            log.info("API listening for Ollama's clients on %s too", self.ollama_address)
        return self

    def _listen(self, port: int) -> socket.socket:
        """Bind here, so a busy port is one clear line from start() (and port 0 gets its number)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host.strip("[]"), port))
            sock.listen(LISTEN_BACKLOG)
        except OSError as exc:
            sock.close()
            raise UserError(f"cannot listen on {self.host}:{port}: {exc.strerror or exc}") from exc
        return sock

    def _serve(self, sockets: list[socket.socket]) -> None:
        async def serve() -> None:
            asyncio.get_running_loop().set_exception_handler(self.connections.loop_exception)
            await self._uvicorn.serve(sockets=sockets)

        try:
            asyncio.run(serve())
        except Exception:  # a bug: the thread ends, start() or stop() reports it
            log.exception("the API server failed")
        finally:
            for sock in sockets:
                sock.close()

    @property
    def address(self) -> str:
        return self._address(self.port)

    @property
    def ollama_address(self) -> str | None:
        """Where the API also listens for Ollama's clients (None: nowhere else)."""
        return self._address(self.ollama_port) if self.ollama_port is not None else None

    def _address(self, port: int) -> str:
        host = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
        return f"http://{host}:{port}"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, cancel running requests, close every connection."""
        if self._uvicorn is None:
            return
        for handle in self.state.stop_accepting():  # submit() refuses from here on
            handle.cancel()  # each ends its reply with a "shutting down" error
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the API server did not stop within %.0f s", timeout)
        self._uvicorn = self._thread = None
        self.state.schema_checks.close()
        self.state.responses.close()
        self.state.schema_checks = SchemaChecks()  # start() again: a new pool
        self.state.stopping = False

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
