"""The FastAPI application: strict JSON bodies, errors in each endpoint's dialect, the routes.

``build_app(api)`` wires the routes (:mod:`core.api.openai_routes`,
:mod:`core.api.anthropic_routes`, :mod:`core.api.responses_routes`,
:mod:`core.api.conversations_routes`, :mod:`core.api.embedding_routes`,
:mod:`core.api.ollama_routes`) behind the
:class:`~core.api.guard.Guard` and installs one handler per kind of failure:

- a body that is not JSON (:func:`core.api.routing.parse_json`): 400 ``invalid_json``;
- a body that fails its pydantic model: 400 naming the field (``param``);
- an unknown path (404) or method (405, with ``Allow``);
- :class:`ApiError` raised by a route: its status and body;
- anything else is a bug: logged with its traceback, answered with one line (500).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from core.api import (
    anthropic_routes,
    conversations_routes,
    embedding_routes,
    ollama_routes,
    openai_routes,
    responses_routes,
)
from core.api.errors import ApiError, dialect_of, validation_error
from core.api.guard import Guard

if TYPE_CHECKING:
    from core.api.state import ApiState

log = logging.getLogger(__name__)


def error_response(request: Request, error: ApiError) -> JSONResponse:
    """The answer to a refused request (the request log has it too)."""
    path = request.url.path
    if error.status >= 500:
        log.warning("%s %s -> %d %s", request.method, path, error.status, error.message)
    else:
        log.info("%s %s -> %d %s", request.method, path, error.status, error.message)
    api = getattr(request.app.state, "api", None)
    if api is not None:
        api.request_log.record_error(path, error.message, error.status)
    return JSONResponse(
        error.body_for(dialect_of(path)), status_code=error.status, headers=error.headers
    )


async def _api_error(request: Request, error: ApiError) -> JSONResponse:
    return error_response(request, error)


async def _invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    skip = 1 if errors and errors[0]["loc"][:1] == ("body",) else 0
    return error_response(request, validation_error(errors, skip=skip))


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    path = request.url.path
    if exc.status_code == 404:
        error = ApiError(404, f"unknown endpoint: {request.method} {path}", code="unknown_url")
    elif exc.status_code == 405:
        allowed = [
            m.strip()
            for m in (exc.headers or {}).get("Allow", "").split(",")
            if m.strip() != "HEAD"
        ]
        error = ApiError(
            405,
            f"{path} does not accept {request.method} (use {', '.join(allowed)})",
            code="method_not_allowed",
            headers={"Allow": ", ".join(allowed)},
        )
    else:
        error = ApiError(exc.status_code, str(exc.detail), code=None)
    return error_response(request, error)


async def _bug(request: Request, exc: Exception) -> JSONResponse:
    # Starlette raises the exception again once this answer is sent: uvicorn logs its traceback
    error = ApiError(
        500,
        f"internal error ({type(exc).__name__}); the server logged it",
        type="server_error",
        code="internal_error",
    )
    return error_response(request, error)


def build_app(api: ApiState) -> Guard:
    """The ASGI application over ``api`` (what :class:`core.api.server.ApiServer` serves)."""

    app = FastAPI(
        title="RadixChat",
        version=api.version,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        description="OpenAI-, Anthropic- and Ollama-compatible API over a local model with a "
        "radix prefix cache.",
    )
    app.state.api = api
    app.include_router(openai_routes.router)
    app.include_router(anthropic_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(conversations_routes.router)
    app.include_router(embedding_routes.router)
    app.include_router(ollama_routes.router)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid_body)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _bug)
    return Guard(app, api, api.allow_origins)
