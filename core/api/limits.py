"""What one request may bring, and where its schemas are checked.

A body's tools and JSON schemas cost work before the engine sees them: pydantic validates
each tool, jsonschema checks each schema against its meta-schema (about 10 µs a byte of
schema here: 2,000 small tools took 1.7 s), the chat template renders them all into the
prompt. Two 1.5 MB bodies of 30,000 tools each held every other client for 35-50 s. So:

- :class:`RequestLimits` bounds the tools of one request (``--max-tools``, counted on the
  parsed JSON before pydantic looks at them) and the bytes of JSON of its tools and its
  response format's schema together (``--max-schema-bytes``); past either, a one-line 400
  names the limit and the option that raises it;
- :class:`core.api.schema_checks.SchemaChecks` runs the checks off the event loop;
- :class:`ByteAllowance` paces each client's request bodies (4 MiB a second past a burst of
  one whole body): JSON is parsed before anything can be said about a body, holding the
  interpreter, so bodies of 30,000 tools sent back to back held every other client up.

The defaults are in :mod:`core.limits` (the command line's help names them).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from core.limits import MAX_OUTPUT_TOKENS, MAX_SCHEMA_BYTES, MAX_TOOLS

__all__ = [
    "BODY_BYTES_PER_S",
    "ByteAllowance",
    "MAX_OUTPUT_TOKENS",
    "MAX_SCHEMA_BYTES",
    "MAX_TOOLS",
    "RequestLimits",
]

BODY_BYTES_PER_S = 4 * 1024 * 1024  # one client's request bodies, past a burst of one whole body


class ByteAllowance:
    """Bytes of request bodies each client may send: a burst of ``burst`` bytes, then
    ``per_s`` a second (a token bucket per client; event loop only). A client past it waits,
    its socket unread (TCP holds the sender back). Why: a body is parsed as JSON before
    anything can be said about it, holding the interpreter (~0.2 s for 4.7 MB); one client
    sending such bodies back to back kept the interpreter busy most of the time, and
    everyone else's requests waited for it between their steps."""

    def __init__(self, burst: int, per_s: float = BODY_BYTES_PER_S):
        self.burst, self.per_s = burst, per_s
        # client (a key's, never a salt's) -> (bytes left, when)
        self._buckets: dict[str, tuple[float, float]] = {}

    async def take(self, client: str, size: int) -> None:
        """Wait until ``client`` may have sent ``size`` more bytes."""
        wait = self.charge(client, size, time.monotonic())
        if wait > 0:
            await asyncio.sleep(wait)

    def charge(self, client: str, size: int, now: float) -> float:
        """Count ``size`` bytes of ``client``'s at time ``now``; the seconds it must wait."""
        left, since = self._buckets.get(client, (self.burst, now))
        left = min(self.burst, left + (now - since) * self.per_s) - size
        self._buckets[client] = (left, now)
        return max(0.0, -left / self.per_s)


@dataclass(frozen=True)
class RequestLimits:
    """How much one request may bring (``radixchat serve --max-tools/--max-schema-bytes``),
    and how many tokens its reply gets when it sets no limit of its own
    (``--max-output-tokens``; 0: up to the model's context)."""

    max_tools: int = MAX_TOOLS
    max_schema_bytes: int = MAX_SCHEMA_BYTES
    max_output_tokens: int = MAX_OUTPUT_TOKENS

    def __post_init__(self):
        if self.max_tools < 1 or self.max_schema_bytes < 1 or self.max_output_tokens < 0:
            raise ValueError("request limits are positive numbers")

    def default_reply_tokens(self, context_length: int) -> int:
        """The token limit of a reply whose request sets none: the server's ceiling, at
        most the context (the prompt's room caps it further)."""
        if self.max_output_tokens == 0:
            return context_length
        return min(self.max_output_tokens, context_length)

    def check_body(self, body: Any) -> None:
        """On the parsed JSON, before pydantic validates it: the number of tools."""
        tools = body.get("tools") if isinstance(body, dict) else None
        if isinstance(tools, list) and len(tools) > self.max_tools:
            raise _refusal(
                f"the request has {len(tools):,} tools; this server takes at most "
                f"{self.max_tools:,} a request (radixchat serve --max-tools N raises it)",
                "too_many_tools",
            )

    def check_schemas(self, schemas: Iterable[Any], param: str = "tools") -> None:
        """The JSON of a request's tools (and response format schema) together, in bytes (as
        ASCII JSON: any other character counts as its escape)."""
        size = sum(len(json.dumps(schema, separators=(",", ":"))) for schema in schemas)
        if size > self.max_schema_bytes:
            raise _refusal(
                f"the request's tools and schemas are {size:,} bytes of JSON; this server "
                f"takes at most {self.max_schema_bytes:,} a request (radixchat serve "
                "--max-schema-bytes N raises it)",
                "schemas_too_large",
                param,
            )


# the limits of a server started without --max-tools/--max-schema-bytes (frozen: one can be shared)
DEFAULT_REQUEST_LIMITS = RequestLimits()


def _refusal(message: str, code: str, param: str = "tools"):
    from core.api.errors import ApiError

    return ApiError(400, message, param=param, code=code)
