"""What one request may bring, and where its schemas are checked.

A body's tools and JSON schemas cost work before the engine sees them: pydantic validates
each tool, jsonschema checks each schema against its meta-schema (about 10 µs a byte of
schema here: 2,000 small tools took 1.7 s), the chat template renders them all into the
prompt. Two 1.5 MB bodies of 30,000 tools each held every other client for 35-50 s. So:

- :class:`RequestLimits` bounds the tools of one request (``--max-tools``, counted on the
  parsed JSON before pydantic looks at them) and the bytes of JSON of its tools and its
  response format's schema together (``--max-schema-bytes``); past either, a one-line 400
  names the limit and the option that raises it;
- :class:`core.api.schema_checks.SchemaChecks` runs the checks off the event loop.

The defaults are in :mod:`core.limits` (the command line's help names them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from core.limits import MAX_SCHEMA_BYTES, MAX_TOOLS

__all__ = ["MAX_SCHEMA_BYTES", "MAX_TOOLS", "RequestLimits"]


@dataclass(frozen=True)
class RequestLimits:
    """How much one request may bring (``radixchat serve --max-tools/--max-schema-bytes``)."""

    max_tools: int = MAX_TOOLS
    max_schema_bytes: int = MAX_SCHEMA_BYTES

    def __post_init__(self):
        if self.max_tools < 1 or self.max_schema_bytes < 1:
            raise ValueError("request limits are positive numbers")

    def check_body(self, body: Any) -> None:
        """On the parsed JSON, before pydantic validates it: the number of tools."""
        tools = body.get("tools") if isinstance(body, dict) else None
        if isinstance(tools, list) and len(tools) > self.max_tools:
            raise _refusal(f"the request has {len(tools):,} tools; this server takes at most "
                           f"{self.max_tools:,} a request (radixchat serve --max-tools N raises it)",
                           "too_many_tools")

    def check_schemas(self, schemas: Iterable[Any], param: str = "tools") -> None:
        """The JSON of a request's tools (and response format schema) together, in bytes (as
        ASCII JSON: any other character counts as its escape)."""
        size = sum(len(json.dumps(schema, separators=(",", ":"))) for schema in schemas)
        if size > self.max_schema_bytes:
            raise _refusal(f"the request's tools and schemas are {size:,} bytes of JSON; this server "
                           f"takes at most {self.max_schema_bytes:,} a request (radixchat serve "
                           "--max-schema-bytes N raises it)", "schemas_too_large", param)


def _refusal(message: str, code: str, param: str = "tools"):
    from core.api.errors import ApiError

    return ApiError(400, message, param=param, code=code)
