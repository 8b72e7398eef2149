"""The ASGI layers in front of the routes: what every request goes through before its body
is parsed.

:class:`Guard` (outermost) counts every request by endpoint and status for ``/metrics``
(499: the client left before an answer), then refuses what no legitimate client sends:

- ambiguous framing: ``Content-Length`` together with ``Transfer-Encoding`` (request
  smuggling behind a proxy; h11 itself refuses two different ``Content-Length``\\ s);
- a ``Host`` that is not a name of the address we bound to (``localhost``,
  ``127.0.0.1``, ``[::1]`` or the bound address): a DNS-rebinding page would send its own
  name. Bound to every interface (``0.0.0.0``, which needs an API key), any Host is taken;
- a browser's ``Origin`` that the user did not allow (``--allow-origin URL``): no web page
  can drive the local API unless allowed. Allowed origins get proper CORS answers
  (preflights included) from Starlette's ``CORSMiddleware``, next in line.

:class:`RequestChecks` (innermost) then checks the API key (``Authorization: Bearer KEY``
or ``x-api-key: KEY``, any of the keys set; ``/health`` and ``/`` are open), notes the key's cache
namespace for the routes (each key has its own: see :mod:`core.engine.namespaces`) and,
for the JSON endpoints, a JSON content type (415: a cross-site ``text/plain`` POST needs
no preflight; without a browser's ``Origin``, a body with no type or curl's form type is
read as JSON), a declared length (411) within the limit (413, before the body is read),
and reads the body whole, within ``BODY_TIMEOUT_S`` (408) and its client's allowance of
bytes (:class:`core.api.limits.ByteAllowance`), to replay it to the routes.
Errors are sent in the endpoint's dialect.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from starlette.middleware.cors import CORSMiddleware

from core.api.errors import ApiError, dialect_of
from core.api.relay import CLIENT_GONE
from core.api.routing import CACHE_NAMESPACE
from core.engine import namespaces

if TYPE_CHECKING:
    from core.api.state import ApiState

log = logging.getLogger(__name__)

OLLAMA_JSON_ENDPOINTS = (
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/api/show",
    "/api/pull",
)
JSON_ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/embeddings",
    *OLLAMA_JSON_ENDPOINTS,
)
# endpoints whose JSON body comes with DELETE (Ollama's)
DELETE_JSON_ENDPOINTS = ("/api/delete",)
OLLAMA_ENDPOINTS = ("/", "/api/version", "/api/tags", "/api/ps")
ENDPOINTS = (
    "/health",
    "/metrics",
    "/openapi.json",
    "/v1/models",
    *OLLAMA_ENDPOINTS,
    *JSON_ENDPOINTS,
    *DELETE_JSON_ENDPOINTS,
)
# no key asked: liveness (Ollama's "/" too: clients probe it before anything else)
OPEN_ENDPOINTS = ("/health", "/")
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
CORS_METHODS = ("GET", "POST", "DELETE", "OPTIONS")
# read as JSON when no browser Origin comes with them: none, and curl -d's default
LENIENT_TYPES = frozenset({"", "application/x-www-form-urlencoded"})
# a request's body, from its head to its end (a body trickled in holds a connection)
BODY_TIMEOUT_S = 60.0


CONVERSATIONS = "/v1/conversations"  # and under it: every POST takes a JSON body


def takes_json(path: str, method: str = "POST") -> bool:
    """Whether a request to ``path`` brings a JSON body (read whole, within the limit): a
    POST to a JSON endpoint, or a DELETE to Ollama's ``/api/delete``."""
    if method == "DELETE":
        return path in DELETE_JSON_ENDPOINTS
    return method == "POST" and (
        path in JSON_ENDPOINTS or path == CONVERSATIONS or path.startswith(CONVERSATIONS + "/")
    )


def endpoint_label(path: str) -> str:
    """The metrics label of a path: the endpoint, never the raw path (unbounded labels)."""
    path = path.rstrip("/") or "/"
    if path in ENDPOINTS or path == CONVERSATIONS:
        return path
    if path.startswith("/v1/responses/"):
        return "/v1/responses/{id}"
    if path.startswith(CONVERSATIONS + "/"):
        parts = path.split("/")[3:]  # {id}, items, {item_id}
        if len(parts) == 1 or (len(parts) <= 3 and parts[1] == "items"):
            return "/".join([CONVERSATIONS, "{id}", "items", "{item_id}"][: len(parts) + 1])
    return "/v1/models/{model}" if path.startswith("/v1/models/") else "other"


def normalize_origin(origin: str) -> str:
    """``HTTP://Example.com:8080/`` -> ``http://example.com:8080``; ``*`` stays."""
    origin = origin.strip().rstrip("/")
    scheme, sep, rest = origin.partition("://")
    if origin != "*" and (not sep or not rest or "/" in rest):
        raise ValueError(
            f"an origin is scheme://host[:port], like http://localhost:3000: {origin!r}"
        )
    return origin if origin == "*" else f"{scheme.lower()}://{rest.lower()}"


def host_name(host: str) -> str | None:
    """The name part of a Host header (``[::1]:8000`` -> ``::1``); None if malformed."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1 :]
        if end < 0 or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return None
        return host[1:end]
    name, _, port = host.partition(":")
    return name if (not port or port.isdigit()) and ":" not in port else None


def _headers(scope) -> dict[str, str]:
    """The request's headers by lower-case name (latin-1, as HTTP has them); the last wins."""
    return {
        name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]
    }


async def send_error(scope, send, error: ApiError, api: ApiState | None = None) -> None:
    """Answer ``error`` (a request refused before the app: the request log has it)."""
    path = scope["path"]
    log.info("%s %s -> %d %s", scope["method"], path, error.status, error.message)
    if api is not None:
        api.request_log.record_error(path, error.message, error.status)
    data = json.dumps(error.body_for(dialect_of(path))).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class Guard:
    """Outermost ASGI layer: request metrics, framing, Host and Origin checks, then CORS."""

    def __init__(self, app, api: ApiState, allow_origins: Iterable[str] = ()):
        self.api = api
        self.allow_origins = frozenset(normalize_origin(o) for o in allow_origins)
        checked = RequestChecks(app, api)
        self.app = (
            CORSMiddleware(
                checked,
                allow_origins=sorted(self.allow_origins),
                allow_methods=CORS_METHODS,
                allow_headers=["*"],
                expose_headers=["WWW-Authenticate", "Allow"],
                max_age=600,
            )
            if self.allow_origins
            else checked
        )
        bound = api.host.strip("[]").lower()
        self.any_host = bound in WILDCARD_HOSTS
        self.host_names = LOOPBACK_NAMES | {bound}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: list[int] = []

        async def counted_send(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            error = self._refusal(_headers(scope))
            if error is not None:
                await send_error(scope, counted_send, error, self.api)
            else:
                await self.app(scope, receive, counted_send)
        finally:
            code = 499 if scope.get(CLIENT_GONE) or not status else status[0]
            self.api.metrics.count_request(endpoint_label(scope["path"]), code)
            client = scope.get("client") or ("?", 0)
            log.info(
                "%s:%s %s %s -> %d", client[0], client[1], scope["method"], scope["path"], code
            )

    def _refusal(self, headers: dict[str, str]) -> ApiError | None:
        if "transfer-encoding" in headers and "content-length" in headers:
            return ApiError(
                400,
                "a request may not have both Content-Length and Transfer-Encoding",
                code="ambiguous_framing",
                headers={"Connection": "close"},
            )
        host = headers.get("host")
        if host is not None and not self.any_host and host_name(host) not in self.host_names:
            return ApiError(
                403,
                f"the Host {host!r} is not this server's: use "
                f"{' or '.join(sorted(self.host_names))}",
                code="host_not_allowed",
            )
        origin = headers.get("origin")
        if (
            origin is not None
            and "*" not in self.allow_origins
            and origin.lower() not in self.allow_origins
        ):
            return ApiError(
                403,
                f"requests from web pages at {origin!r} are not allowed (start the server "
                "with --allow-origin ORIGIN to allow one)",
                code="origin_not_allowed",
            )
        return None


def _json_type(media_type: str, from_page: bool) -> bool:
    """Whether a body of ``media_type`` is read as JSON. A browser sends ``Origin`` with
    every cross-site POST: from a page, only a JSON type (a page cannot send one without a
    CORS preflight, which the guard answers only for allowed origins). Without ``Origin``
    (curl, scripts), also no type at all and curl's default for ``-d``
    (``application/x-www-form-urlencoded``), as llama.cpp, Ollama and mlx_lm.server take them."""
    if media_type == "application/json" or media_type.endswith("+json"):
        return True
    return not from_page and media_type in LENIENT_TYPES


class RequestChecks:
    """Innermost ASGI layer: the API key, then a JSON body's type, length and limit."""

    def __init__(self, app, api: ApiState):
        self.app = app
        self.api = api

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            receive = await self._check(scope, receive)
        except ApiError as error:
            await send_error(scope, send, error, self.api)
        else:
            await self.app(scope, receive, send)

    async def _check(self, scope, receive) -> Callable:
        """Raise ApiError to refuse; return the receive callable the routes should use."""
        path = scope["path"].rstrip("/") or "/"
        headers = _headers(scope)
        key = self._key(headers)
        if key is not None or not self.api.api_keys:
            scope[CACHE_NAMESPACE] = self.api.cache_namespace(key)
        elif path not in OPEN_ENDPOINTS:
            raise ApiError(
                401,
                "missing or incorrect API key: send 'Authorization: Bearer KEY' "
                "(or 'x-api-key: KEY')",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not takes_json(path, scope["method"]):
            return receive
        declared = headers.get("content-length")
        if declared is None and "transfer-encoding" not in headers:
            raise ApiError(
                411,
                "a Content-Length header is required",
                code="length_required",
                headers={"Connection": "close"},
            )
        if declared is not None and int(declared) > self.api.max_body_bytes:  # h11 checked its form
            raise self._too_large(f"{declared} bytes")
        media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
        if not _json_type(media_type, from_page="origin" in headers):
            raise ApiError(
                415,
                f"{path} takes a JSON body: send 'Content-Type: application/json'"
                + (f", not {media_type!r}" if media_type else ""),
                code="unsupported_media_type",
                headers={"Connection": "close"},
            )
        if media_type in LENIENT_TYPES:  # read as JSON: the routes parse what says so
            scope["headers"] = [
                *((k, v) for k, v in scope["headers"] if k.lower() != b"content-type"),
                (b"content-type", b"application/json"),
            ]
        return await self._buffered(receive, namespaces.owner(scope.get(CACHE_NAMESPACE, "")))

    def _key(self, headers: dict[str, str]) -> str | None:
        """The API key this request carries, if it is one of the keys set (else None).
        Every key is compared, in constant time each."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        sent = [token.strip().encode()] if scheme.lower() == "bearer" else []
        sent.append(headers.get("x-api-key", "").strip().encode())
        found = None
        for key in self.api.api_keys:
            for candidate in sent:
                if hmac.compare_digest(candidate, key.encode()) and found is None:
                    found = key
        return found

    def _too_large(self, size: str) -> ApiError:
        return ApiError(
            413,
            f"the request body is {size}; the limit is {self.api.max_body_bytes} bytes",
            code="request_too_large",
            headers={"Connection": "close"},
        )

    async def _buffered(self, receive, client: str) -> Callable:
        """Read the whole body (within the limit, chunked or not, within ``BODY_TIMEOUT_S``, at
        the ``client``'s allowance of bytes); replay it to the routes."""
        chunks, size, more = [], 0, True
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise ApiError(
                            400, "the client went away while sending its body", code="client_gone"
                        )
                    chunks.append(message.get("body", b""))
                    size += len(chunks[-1])
                    await self.api.body_bytes.take(client, len(chunks[-1]))
                    more = message.get("more_body", False)
                    if size > self.api.max_body_bytes:
                        raise self._too_large(f"over {size} bytes")
        except TimeoutError:
            raise ApiError(
                408,
                f"the request body did not arrive within {BODY_TIMEOUT_S:g} s",
                code="request_timeout",
                headers={"Connection": "close"},
            ) from None
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay
