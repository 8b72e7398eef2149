"""Errors the API answers with, in every dialect, and how pydantic's validation errors become them.

An :class:`ApiError` is one refusal: an HTTP status, one line of text, and (OpenAI style)
the ``param`` it is about. The same error renders as OpenAI's
``{"error": {"message", "type", "param", "code"}}``, as Anthropic's
``{"type": "error", "error": {"type", "message"}}`` or as Ollama's ``{"error": "message"}``;
which one is decided by the endpoint (:func:`dialect_of`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any, Literal

from core.engine.types import ErrorEvent
from core.errors import ErrorKind

log = logging.getLogger(__name__)

Dialect = Literal["openai", "anthropic", "ollama"]
ANTHROPIC_PATHS = ("/v1/messages",)
RETRY_WAITING_S = 1  # Retry-After of a 429 for a key with its queue of waiting prompts full
OLLAMA_PREFIX = "/api/"

# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class ApiError(Exception):
    """A request the server refuses, as OpenAI reports it (and Anthropic, by :meth:`body_for`)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_body(self) -> dict[str, Any]:
        kind = _ANTHROPIC_TYPES.get(
            self.status, "api_error" if self.status >= 500 else "invalid_request_error"
        )
        # Anthropic's errors have no param: the message names the field, as Anthropic's do
        message = (
            self.message
            if not self.param or self.param in self.message
            else f"{self.param}: {self.message}"
        )
        return {"type": "error", "error": {"type": kind, "message": message}}

    def ollama_body(self) -> dict[str, Any]:
        """Ollama's shape: the message alone (naming the field, as Anthropic's)."""
        return {"error": self.anthropic_body()["error"]["message"]}

    def body_for(self, dialect: Dialect) -> dict[str, Any]:
        if dialect == "anthropic":
            return self.anthropic_body()
        return self.ollama_body() if dialect == "ollama" else self.body()


def dialect_of(path: str) -> Dialect:
    if path.startswith(OLLAMA_PREFIX):
        return "ollama"
    return "anthropic" if path.rstrip("/").startswith(ANTHROPIC_PATHS) else "openai"


def invalid(param: str | None, message: str, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def shutting_down() -> ApiError:
    return ApiError(
        503,
        "the request was cancelled: the server is shutting down",
        type="server_error",
        code="cancelled",
    )


def engine_error(event: ErrorEvent, chat: bool) -> ApiError:
    """The API's error for an engine ErrorEvent, by its kind: what was asked is a 400, what
    the server lacks (a model, memory) a 503, a key with its queue full a 429, a bug a 500."""
    kind = event.kind
    if kind is ErrorKind.INTERNAL:
        log.error("request failed: %s", event.message)
        return ApiError(500, event.message, type="server_error", code=kind.value)
    if kind is ErrorKind.CONTEXT_TOO_LONG:
        return ApiError(400, event.message, param="messages" if chat else "prompt", code=kind.value)
    if kind in (ErrorKind.MODEL_NOT_LOADED, ErrorKind.OUT_OF_MEMORY):
        return ApiError(503, event.message, type="server_error", code=kind.value)
    if kind is ErrorKind.TOO_MANY_WAITING:  # the key's queue is full: retry (SDKs do, on a 429)
        return ApiError(
            429,
            event.message,
            type="rate_limit_error",
            code=kind.value,
            headers={"Retry-After": str(RETRY_WAITING_S)},
        )
    return ApiError(400, event.message)


# ------------------------------------------------------------------ from pydantic
# A segment of a pydantic error location that is a field name: our wire formats name
# their fields in snake_case. Anything else in a location is a union member's label
# ("str", "list[TextPart]", "function-after[...]", a model's class name), not a field.
_FIELD = re.compile(r"^[a-z_][a-z0-9_]*$")
_TYPE_LABELS = {"str", "int", "float", "bool", "list", "dict", "none", "bytes"}
_TYPE_ERRORS = re.compile(
    r"(_type|_parsing|_class|^none_required|^is_instance_of|^union_tag_invalid"
    r"|^model_attributes_type)$"
)


def param_of(loc: Iterable[Any]) -> str | None:
    """``("messages", 0, "content", "str")`` -> ``"messages[0].content"``."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif _FIELD.match(str(part)) and part not in _TYPE_LABELS:
            param += f".{part}" if param else str(part)
    return param or None


def _code(error_type: str) -> str:
    if error_type == "missing":
        return "missing_required_parameter"
    if error_type == "json_invalid":
        return "invalid_json"
    return "invalid_type" if _TYPE_ERRORS.search(error_type) else "invalid_value"


def validation_error(errors: list[dict[str, Any]], skip: int = 0) -> ApiError:
    """One 400 for pydantic's error list: the first field at fault, named as ``param``.
    ``skip`` drops leading location parts (FastAPI puts ``"body"`` first). A union that
    fails on every member gives one error per member: the deepest is said, and members that
    fail at the same place are said together."""
    if not errors:
        return invalid(None, "invalid request")
    first = errors[0]
    if first["type"] == "json_invalid":
        detail = (first.get("ctx") or {}).get("error") or first.get("msg", "")
        return invalid(None, f"the request body is not valid JSON: {detail}", code="invalid_json")
    params = [param_of(e["loc"][skip:]) for e in errors]
    # a union that fails on every member: the member that got furthest into the value says
    # the most ("content[0].type", not "content" is not a string)
    root = params[0]
    param = max(
        (
            p
            for p in params
            if root is None or p == root or (p or "").startswith((root + ".", root + "["))
        ),
        key=lambda p: len(p or ""),
    )
    same = [e for e, p in zip(errors, params) if p == param]
    if any(_code(e["type"]) != "invalid_type" for e in same):  # the member of the right type
        same = [e for e in same if _code(e["type"]) != "invalid_type"]
    first = same[0]
    code = _code(first["type"])
    if param is None:
        if code == "missing_required_parameter":
            return invalid(None, "a JSON request body is required", code=code)
        if code == "invalid_type":
            return invalid(None, "the request body must be a JSON object", code=code)
    if code == "missing_required_parameter":
        return invalid(param, f"'{param}' is required", code=code)
    if all(_code(e["type"]) == "invalid_type" for e in same):
        code = "invalid_type"
    messages = " or ".join(dict.fromkeys(_message(e) for e in same))
    return invalid(param, f"invalid '{param}': {messages}", code=code)


def _message(error: dict[str, Any]) -> str:
    message = str(error.get("msg", "invalid value"))
    return message.removeprefix("Value error, ")
