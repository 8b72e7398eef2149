"""The ASGI layer in front of the routes: what every request goes through before its body
is parsed.

In order: the API key (``Authorization: Bearer KEY`` or ``x-api-key: KEY``; ``/health``
is open), then for the JSON endpoints a declared body length (411 without one) within
the limit (413, before the body is read), the body read whole and replayed to the
routes. It also counts every request by endpoint and status for ``/metrics`` (499: the
client left before an answer). Errors are sent in the endpoint's dialect.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import TYPE_CHECKING, Callable

from core.api.errors import ApiError, dialect_of
from core.api.relay import CLIENT_GONE

if TYPE_CHECKING:
    from core.api.server import ApiServer

log = logging.getLogger(__name__)

JSON_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens")
ENDPOINTS = ("/health", "/metrics", "/openapi.json", "/v1/models", *JSON_ENDPOINTS)
OPEN_ENDPOINTS = ("/health",)


def endpoint_label(path: str) -> str:
    """The metrics label of a path: the endpoint, never the raw path (unbounded labels)."""
    path = path.rstrip("/") or "/"
    if path in ENDPOINTS:
        return path
    return "/v1/models/{model}" if path.startswith("/v1/models/") else "other"


class _BodyTooLarge(Exception):
    pass


class Guard:
    """ASGI middleware: authentication, body framing and limits, request metrics."""

    def __init__(self, app, api: "ApiServer"):
        self.app = app
        self.api = api

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"].rstrip("/") or "/"
        status: list[int] = []

        async def counted_send(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            receive = await self._check(scope, receive, path)
        except ApiError as error:
            await self._refuse(scope, counted_send, error, path)
        else:
            await self.app(scope, receive, counted_send)
        finally:
            code = 499 if scope.get(CLIENT_GONE) or not status else status[0]
            self.api.metrics.count_request(endpoint_label(path), code)

    async def _check(self, scope, receive, path: str) -> Callable:
        """Raise ApiError to refuse; return the receive callable the routes should use."""
        headers = _headers(scope)
        if path not in OPEN_ENDPOINTS and not self._authorized(headers):
            raise ApiError(401, "missing or incorrect API key: send 'Authorization: Bearer KEY' "
                                "(or 'x-api-key: KEY')", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})
        if scope["method"] != "POST" or path not in JSON_ENDPOINTS:
            return receive
        chunked = "transfer-encoding" in headers
        declared = headers.get("content-length")
        if declared is None and not chunked:
            raise ApiError(411, "a Content-Length header is required", code="length_required",
                           headers={"Connection": "close"})
        if declared is not None and int(declared) > self.api.max_body_bytes:  # h11 checked its form
            raise self._too_large(f"{declared} bytes")
        return await self._buffered(receive)

    def _authorized(self, headers: dict[str, str]) -> bool:
        key = self.api.api_key
        if key is None:
            return True
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode()):
            return True
        return hmac.compare_digest(headers.get("x-api-key", "").strip().encode(), key.encode())

    def _too_large(self, size: str) -> ApiError:
        return ApiError(413, f"the request body is {size}; the limit is {self.api.max_body_bytes} "
                             "bytes", code="request_too_large", headers={"Connection": "close"})

    async def _buffered(self, receive) -> Callable:
        """Read the whole body (within the limit, chunked or not); replay it to the routes."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ApiError(400, "the client went away while sending its body", code="client_gone")
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.api.max_body_bytes:
                raise self._too_large(f"over {size} bytes")
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay

    async def _refuse(self, scope, send, error: ApiError, path: str) -> None:
        log.info("%s %s -> %d %s", scope["method"], path, error.status, error.message)
        data = json.dumps(error.body_for(dialect_of(path))).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": data})


def _headers(scope) -> dict[str, str]:
    """The request's headers by lower-case name (latin-1, as HTTP has them); the last wins."""
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
