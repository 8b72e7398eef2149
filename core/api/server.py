"""The OpenAI-compatible HTTP API over the engine, on the standard library's HTTP server.

    server = ApiServer(engine, "127.0.0.1", 0).start()   # port 0: any free port
    print(server.address)                                # http://127.0.0.1:54321
    ...
    server.stop()

Endpoints: ``GET /health``, ``GET /v1/models`` (and ``/v1/models/{id}``),
``POST /v1/chat/completions``, ``POST /v1/completions`` (JSON or server-sent events),
``GET /metrics`` (Prometheus). Each connection gets a thread; each request is submitted
to the engine and its events are relayed as they come. A client that goes away (a
failed write, or its socket found closed while it waits) cancels its request, so the
engine moves on and frees its pages. ``radixchat serve`` is
``core.cli.serve``.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import queue
import select
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote, urlsplit

from core.engine.engine import Engine, RequestHandle
from core.engine.types import DoneEvent, ErrorEvent, Event, GenerationRequest, TokenEvent
from core.errors import ErrorKind, UserError
from core.api.openai_schema import MODEL_ALIASES, ApiError, CompletionCall, ModelCard, ReplyBuilder, parse_call
from core.api.metrics import ServerMetrics

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
POLL_S = 0.2  # how often a waiting request checks that its client is still there
SESSION_HEADER = "X-RadixChat-Session"
_ROUTES = {
    "/health": {"GET": "_health"},
    "/v1/models": {"GET": "_models"},
    "/v1/chat/completions": {"POST": "_chat_completions"},
    "/v1/completions": {"POST": "_completions"},
    "/metrics": {"GET": "_metrics"},
}
_MODEL_PATH = "/v1/models/"


def _shutting_down() -> ApiError:
    return ApiError(503, "the request was cancelled: the server is shutting down", type="server_error",
                    code="cancelled")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to listen beyond loopback without an API key."""
    if not api_key and not is_loopback(host):
        raise UserError(f"refusing to serve on {host} without an API key: pass --api-key KEY "
                        "(or set RADIXCHAT_API_KEY), or bind to 127.0.0.1")


class ApiServer:
    """The HTTP API over one engine; serves on a background thread between start() and stop()."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None, model_name: str | None = None,
                 max_body_bytes: int = MAX_BODY_BYTES):
        check_bind(host, api_key)
        self.engine = engine
        self.host = host
        self.port = port
        self.api_key = api_key or None
        self.model_name = model_name
        self.max_body_bytes = max_body_bytes
        self.started_at = int(time.time())
        self._handles: set[RequestHandle] = set()
        self._lock = threading.Lock()
        self.metrics = ServerMetrics(engine.stats, lambda: len(self._handles))
        self._httpd: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self.stopping = False

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "ApiServer":
        server_class = _HttpServerV6 if ":" in self.host else _HttpServer
        if not 0 <= self.port <= 65535:
            raise UserError(f"cannot listen on port {self.port}: a port is 0 to 65535")
        try:
            self._httpd = server_class((self.host.strip("[]"), self.port), _Handler, self)
        except OSError as exc:
            raise UserError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from exc
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="radixchat-api", daemon=True)
        self._thread.start()
        log.info("API listening on %s", self.address)
        return self

    @property
    def address(self) -> str:
        host = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, cancel running requests, close every connection."""
        if self._httpd is None:
            return
        with self._lock:
            self.stopping = True  # submit() refuses from here on
            running = list(self._handles)
        self._httpd.shutdown()
        for handle in running:
            handle.cancel()
        self._httpd.close_connections(timeout)
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout)
        self._httpd = self._thread = None
        self.stopping = False

    def __enter__(self) -> "ApiServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------ used by handlers
    def model_card(self) -> ModelCard:
        info = self.engine.model_info
        if info is None:
            raise ApiError(503, "no model is loaded yet", type="server_error", code="model_not_loaded")
        model_id = self.model_name or info.name
        aliases = {model_id, info.name, info.spec, Path(info.path).name, *MODEL_ALIASES}
        return ModelCard(model_id, info.fingerprint, info.context_length, frozenset(aliases),
                         self.started_at)

    def authorized(self, header: str | None) -> bool:
        if self.api_key is None:
            return True
        scheme, _, token = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    def submit(self, request: GenerationRequest) -> RequestHandle:
        with self._lock:
            if self.stopping:
                raise _shutting_down()
            handle = self.engine.submit(request)
            self._handles.add(handle)
        return handle

    def release(self, handle: RequestHandle) -> None:
        with self._lock:
            self._handles.discard(handle)


class _HttpServer(ThreadingHTTPServer):
    """One daemon thread per connection, each tracked so stop() can close it."""

    daemon_threads = True

    def __init__(self, address, handler, api: ApiServer):
        self.api = api
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        thread = threading.Thread(target=self._serve_connection, args=(request, client_address),
                                  name="radixchat-api-conn", daemon=True)
        with self._connections_lock:
            self._connections[request] = thread
        thread.start()

    def _serve_connection(self, request, client_address) -> None:
        try:
            self.process_request_thread(request, client_address)  # closes the socket
        finally:
            with self._connections_lock:
                self._connections.pop(request, None)

    def close_connections(self, timeout: float) -> None:
        """End every connection: reads see end of file, so idle keep-alive threads exit
        and running ones finish their (cancelled) reply first."""
        started = time.monotonic()
        for how, share in ((socket.SHUT_RD, 0.5), (socket.SHUT_RDWR, 1.0)):  # then cut writes too
            with self._connections_lock:
                connections = list(self._connections.items())
            for sock, _ in connections:
                try:
                    sock.shutdown(how)
                except OSError:
                    pass
            for _, thread in connections:
                thread.join(max(0.0, started + timeout * share - time.monotonic()))
        if self._connections:
            log.warning("%d API connections did not close in time", len(self._connections))

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("connection from %s ended: %s", client_address, exc)
        else:
            log.exception("API connection from %s failed", client_address)


def _no_constant(name: str) -> None:
    """JSON has no NaN or Infinity (Python's json module accepts them by default)."""
    raise ValueError(f"{name} is not a JSON value")


class _HttpServerV6(_HttpServer):
    address_family = socket.AF_INET6


def engine_error(event: ErrorEvent, chat: bool) -> ApiError:
    """The API's error for an engine ErrorEvent, by its kind: what was asked is a 400, what
    the server lacks (a model, memory) a 503, a bug a 500."""
    kind = event.kind
    if kind is ErrorKind.INTERNAL:
        log.error("request failed: %s", event.message)
        return ApiError(500, event.message, type="server_error", code=kind.value)
    if kind is ErrorKind.CONTEXT_TOO_LONG:
        return ApiError(400, event.message, param="messages" if chat else "prompt", code=kind.value)
    if kind in (ErrorKind.MODEL_NOT_LOADED, ErrorKind.OUT_OF_MEMORY):
        return ApiError(503, event.message, type="server_error", code=kind.value)
    return ApiError(400, event.message)


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"
    server_version = "RadixChat"
    timeout = 300  # seconds an idle keep-alive connection or a slow upload may take

    def setup(self) -> None:
        super().setup()
        self._status: int | None = None
        self._client_gone = False
        self._body_read = False
        self._chunked = True

    @property
    def api(self) -> ApiServer:
        return self.server.api

    # ------------------------------------------------------------ dispatch
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")

    def _path(self) -> str:
        return urlsplit(getattr(self, "path", "") or "").path.rstrip("/") or "/"

    def _endpoint(self) -> str:
        path = self._path()
        if path in _ROUTES:
            return path
        return "/v1/models/{model}" if path.startswith(_MODEL_PATH) else "other"

    def _routes(self) -> dict[str, str] | None:
        path = self._path()
        return _ROUTES.get(path) or ({"GET": "_model"} if path.startswith(_MODEL_PATH) else None)

    def _dispatch(self, method: str) -> None:
        self._status, self._client_gone, self._body_read = None, False, False
        path = self._path()
        try:
            if path != "/health" and not self.api.authorized(self.headers.get("Authorization")):
                raise ApiError(401, "missing or incorrect API key: send 'Authorization: Bearer KEY'",
                               code="invalid_api_key")
            routes = self._routes()
            if routes is None:
                raise ApiError(404, f"unknown endpoint: {method} {path}", code="unknown_url")
            if method not in routes:
                raise ApiError(405, f"{path} does not accept {method} (use {', '.join(routes)})",
                               code="method_not_allowed")
            getattr(self, routes[method])()
        except ApiError as error:
            self._send_error(error)
        except OSError as exc:  # the client went away while we read or wrote
            log.debug("client %s gone: %s", self.client_address, exc)
            self.close_connection = True
        except Exception as exc:  # a bug: log it, answer one line, keep serving
            log.exception("%s %s failed", method, path)
            self._send_error(ApiError(500, f"internal error: {exc}", type="server_error",
                                      code="internal_error"))
        if self._status is None:  # nothing sent: the client left first
            self.api.metrics.count_request(self._endpoint(), 499)
            self.close_connection = True

    # ------------------------------------------------------------ responses
    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        self.api.metrics.count_request(self._endpoint(), code)
        super().send_response(code, message)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol errors found by the base class (bad request line, unsupported method)."""
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        self._send_json(code, ApiError(code, message or phrase).body())

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, error: ApiError) -> None:
        if self._status is not None:  # a stream already started: nothing sane to add
            self.close_connection = True
            return
        if not self._body_read and (self._declared_length() or self.headers.get("Transfer-Encoding")):
            self.close_connection = True  # its unread body would be taken for the next request
        headers = {}
        if error.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        elif error.status == 405:
            headers["Allow"] = ", ".join(self._routes() or {})
        log.info("%s %s -> %d %s", self.command, self._path(), error.status, error.message)
        self._send_json(error.status, error.body(), headers)

    def log_message(self, format: str, *args) -> None:
        log.info("%s %s", self.address_string(), format % args)

    # ------------------------------------------------------------ request bodies
    def handle_expect_100(self) -> bool:
        if self._declared_length() > self.api.max_body_bytes:  # refuse before the upload
            self._send_error(self._too_large(self._declared_length()))
            return False
        return super().handle_expect_100()

    def _declared_length(self) -> int:
        try:
            return int(self.headers.get("Content-Length", "0"))
        except ValueError:
            return 0

    def _too_large(self, length: int) -> ApiError:
        self.close_connection = True
        return ApiError(413, f"the request body is {length} bytes; the limit is "
                             f"{self.api.max_body_bytes} bytes", code="request_too_large")

    def _read_json(self) -> Any:
        declared = self.headers.get("Content-Length")
        if declared is None:
            self.close_connection = True
            raise ApiError(411, "a Content-Length header is required", code="length_required")
        try:
            length = int(declared)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise ApiError(400, f"invalid Content-Length: {declared!r}") from None
        if length > self.api.max_body_bytes:
            raise self._too_large(length)
        data = self.rfile.read(length)
        if len(data) < length:
            raise ConnectionResetError("the request body ended early")
        self._body_read = True
        try:
            return json.loads(data, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
        except RecursionError:
            raise ApiError(400, "the request body is nested too deeply", code="invalid_json") from None

    # ------------------------------------------------------------ endpoints
    def _health(self) -> None:
        info = self.api.engine.model_info
        if info is None:
            self._send_json(503, {"status": "loading"})
        else:
            self._send_json(200, {"status": "ok", "model": self.api.model_card().id})

    def _model_object(self, card: ModelCard) -> dict[str, Any]:
        return {"id": card.id, "object": "model", "created": card.created, "owned_by": "radixchat",
                "radixchat": {"fingerprint": card.fingerprint, "context_length": card.context_length}}

    def _models(self) -> None:
        card = self.api.model_card()
        self._send_json(200, {"object": "list", "data": [self._model_object(card)]})

    def _model(self) -> None:
        card = self.api.model_card()
        name = unquote(self._path()[len(_MODEL_PATH):])
        if name not in card.aliases:
            raise ApiError(404, f"the model '{name}' does not exist; this server serves '{card.id}'",
                           param="model", code="model_not_found")
        self._send_json(200, self._model_object(card))

    def _metrics(self) -> None:
        data, content_type = self.api.metrics.exposition()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chat_completions(self) -> None:
        self._generate(chat=True)

    def _completions(self) -> None:
        self._generate(chat=False)

    # ------------------------------------------------------------ generation
    def _generate(self, chat: bool) -> None:
        body = self._read_json()
        card = self.api.model_card()
        call = parse_call(body, chat, card, self.headers.get(SESSION_HEADER))
        handle = self.api.submit(call.request)
        try:
            events = self._watched_events(handle, time.monotonic())
            if call.stream:
                self._relay_stream(call, ReplyBuilder(call, card), handle, events)
            else:
                self._relay_full(call, ReplyBuilder(call, card), events)
        finally:
            handle.cancel()  # a no-op once the request has ended
            self.api.release(handle)

    def _watched_events(self, handle: RequestHandle, arrived: float) -> Iterator[Event]:
        """The request's events; cancels it when the client goes away. Records metrics."""
        first_token_at = None
        checked = time.monotonic()
        while True:
            try:
                for event in handle.events(timeout=POLL_S):
                    if isinstance(event, TokenEvent) and first_token_at is None:
                        first_token_at = time.monotonic()
                    elif isinstance(event, DoneEvent):
                        ttft = (first_token_at or time.monotonic()) - arrived
                        self.api.metrics.record_generation(event.stats, ttft)
                    if isinstance(event, (DoneEvent, ErrorEvent)):
                        self.api.release(handle)  # no longer in flight, before the reply is sent
                    yield event
                    if time.monotonic() - checked > POLL_S:
                        checked = time.monotonic()
                        self._cancel_if_gone(handle)
                return
            except queue.Empty:
                checked = time.monotonic()
                self._cancel_if_gone(handle)

    def _cancel_if_gone(self, handle: RequestHandle) -> None:
        if self.api.stopping:  # stop() cancelled every request and shut our reads itself
            return
        if self._client_gone or self._peer_closed():
            self._client_gone = True
            handle.cancel()

    def _peer_closed(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _relay_full(self, call: CompletionCall, reply: ReplyBuilder, events: Iterator[Event]) -> None:
        done = error = None
        for event in events:
            if isinstance(event, DoneEvent):
                done = event
            elif isinstance(event, ErrorEvent):
                error = engine_error(event, call.chat)
        if self._client_gone:
            return
        if error is not None:
            raise error
        if done is None or done.stats.finish_reason == "cancelled":
            raise _shutting_down()
        self._send_json(200, reply.full(done.text, done.stats))

    def _relay_stream(self, call: CompletionCall, reply: ReplyBuilder, handle: RequestHandle,
                      events: Iterator[Event]) -> None:
        started = False
        for event in events:
            if self._client_gone:
                continue  # drain: the engine is stopping this request
            if isinstance(event, ErrorEvent) and not started:
                raise engine_error(event, call.chat)
            try:
                if not started:
                    started = True
                    self._start_events()
                    if call.chat:
                        self._send_event(reply.chunk(first=True))
                if isinstance(event, TokenEvent):
                    self._send_event(reply.chunk(event.text))
                elif isinstance(event, ErrorEvent):
                    self._send_event(engine_error(event, call.chat).body())
                    self._end_events()
                elif isinstance(event, DoneEvent):
                    if event.stats.finish_reason == "cancelled":  # the server is stopping
                        self.close_connection = True
                        self._send_event(_shutting_down().body())
                    else:
                        self._send_event(reply.chunk(stats=event.stats))
                        if call.include_usage:
                            self._send_event(reply.usage_chunk(event.stats))
                        self._write_chunk(b"data: [DONE]\n\n")
                    self._end_events()
            except OSError as exc:  # BrokenPipeError, ConnectionResetError, a write timeout
                log.info("client %s went away mid-stream (%s): cancelling", self.client_address, exc)
                self._client_gone = True
                self.close_connection = True
                handle.cancel()

    def _start_events(self) -> None:
        self._chunked = self.request_version != "HTTP/1.0"  # HTTP/1.0: the body ends at close
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        if self._chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()

    def _send_event(self, body: dict[str, Any]) -> None:
        self._write_chunk(b"data: " + json.dumps(body).encode() + b"\n\n")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data) if self._chunked else data)

    def _end_events(self) -> None:
        if self._chunked:
            self.wfile.write(b"0\r\n\r\n")
