"""What the routes share: strict JSON bodies, the server behind a request, the session and
priority headers, and where a body's checks run.

:class:`JsonRoute` is FastAPI's route with the body read by :func:`parse_json`: JSON as
RFC 8259 has it (no NaN or Infinity, which Python's json module reads by default), and
a body nested too deeply or not UTF-8 is a JSONDecodeError too, which FastAPI turns into
a validation error (400 ``invalid_json``). Before pydantic validates the body, its tools
are counted (:meth:`core.api.limits.RequestLimits.check_body`): 30,000 tools are a 400
at once, not seconds of validation on the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from fastapi import Header, Request, Response
from fastapi.routing import APIRoute

from core.api.wire import PRIORITY_HEADER
from core.engine import namespaces

if TYPE_CHECKING:
    from core.api.state import ApiState

SESSION_HEADER = "X-RadixChat-Session"
# The reply names the cache namespace its prompt was looked up in (a label, never a key).
NAMESPACE_HEADER = "X-RadixChat-Cache-Namespace"
CACHE_NAMESPACE = "radixchat.cache_namespace"  # scope key: the guard's, from the API key used
SessionHeader = Annotated[
    str | None,
    Header(alias=SESSION_HEADER, description="the chat session whose cache this request extends"),
]
PriorityHeader = Annotated[
    str | None,
    Header(alias=PRIORITY_HEADER, description="lower is prefilled sooner: 0 (default) or more"),
]
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
T = TypeVar("T")


def server_of(request: Request) -> ApiState:
    return request.app.state.api


def named(response: Response, namespace: str) -> Response:
    """``response`` with the header naming the cache namespace of its request (a label)."""
    response.headers[NAMESPACE_HEADER] = namespaces.label(namespace)
    return response


def key_namespace(request: Request) -> str:
    """The cache namespace of the key this request came with (the guard put it there)."""
    return request.scope.get(CACHE_NAMESPACE) or server_of(request).cache_namespace(None)


async def checked_call(request: Request, body: Any, to_call: Callable[..., T], *args) -> T:
    """``to_call(body, *args, limits=...)``: the checks that turn a validated body into an
    engine request. A body with tools or a response format has its schemas checked, off
    the event loop (:class:`core.api.schema_checks.SchemaChecks`); any other is cheap, done here."""
    api = server_of(request)
    if any(getattr(body, name, None) for name in ("tools", "response_format", "text", "format")):
        return await api.schema_checks.run(
            key_namespace(request), to_call, body, *args, limits=api.limits
        )
    return to_call(body, *args, limits=api.limits)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")


def parse_json(data: bytes) -> Any:
    """JSON as RFC 8259 has it: no NaN or Infinity; any failure is a JSONDecodeError."""
    try:
        return json.loads(data, parse_constant=_no_constant)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("the body is nested too deeply", "", 0) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise json.JSONDecodeError(str(exc), "", 0) from None


class _StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """A route whose JSON body is read by :func:`parse_json`, its tools counted before
    pydantic validates it."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def strict_handler(request: Request):
            strict = _StrictJsonRequest(request.scope, request.receive)
            if request.method == "POST":
                try:
                    body = await strict.json()
                except json.JSONDecodeError:
                    pass  # FastAPI reads it again and answers 400 invalid_json
                else:
                    server_of(strict).limits.check_body(body)
            return await handler(strict)

        return strict_handler
