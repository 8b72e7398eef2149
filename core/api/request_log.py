"""The last requests the API served, for a person to look at (the app's request log).

Each generation request that ends is one :class:`LoggedRequest`: when, which dialect
(OpenAI, Anthropic or Ollama, from its path), its tokens, how many of its prompt tokens the cache
served, its time to first token and how it ended. The log keeps the newest ``size``; the
event loop appends, any thread reads (``recent()`` returns a copy).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from core.engine.types import RequestStats

DEFAULT_SIZE = 200


def dialect_of(path: str) -> str:
    """ "anthropic" for ``/v1/messages`` and below, "responses" for ``/v1/responses``,
    "ollama" for ``/api/...``, else "openai"."""
    if path.startswith("/api/"):
        return "ollama"
    path = path.rstrip("/")
    if path.startswith("/v1/messages"):
        return "anthropic"
    return "responses" if path.startswith("/v1/responses") else "openai"


@dataclass(frozen=True)
class LoggedRequest:
    """One finished request. ``error``: its one-line error, when it ended in one."""

    at: float  # time.time() when it ended
    dialect: str  # "openai" | "anthropic" | "responses" | "ollama"
    path: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # served from the RAM cache
    restored_tokens: int = 0  # served from the disk cache
    ttft_s: float = 0.0  # from arrival to the first token, queueing included
    finish_reason: str = ""
    error: str | None = None
    status: int = 200  # the HTTP status: a refused request's 4xx (it never reached the engine)

    @property
    def served_tokens(self) -> int:
        """Prompt tokens the cache served, RAM and disk."""
        return self.cached_tokens + self.restored_tokens


class RequestLog:
    """The newest ``size`` finished requests, oldest first."""

    def __init__(self, size: int = DEFAULT_SIZE):
        self._entries: deque[LoggedRequest] = deque(maxlen=size)
        self._lock = threading.Lock()

    def record(self, path: str, stats: RequestStats, ttft_s: float) -> None:
        self._add(
            LoggedRequest(
                at=time.time(),
                dialect=dialect_of(path),
                path=path,
                prompt_tokens=stats.prompt_tokens,
                completion_tokens=stats.completion_tokens,
                cached_tokens=stats.cached_tokens,
                restored_tokens=stats.restored_tokens,
                ttft_s=ttft_s,
                finish_reason=stats.finish_reason,
            )
        )

    def record_error(self, path: str, message: str, status: int = 200) -> None:
        """A request that ended in an error: after it reached the engine (``status`` 200,
        sent before the error, in a stream), or refused with ``status``."""
        self._add(LoggedRequest(time.time(), dialect_of(path), path, error=message, status=status))

    def recent(self) -> tuple[LoggedRequest, ...]:
        with self._lock:
            return tuple(self._entries)

    def _add(self, entry: LoggedRequest) -> None:
        with self._lock:
            self._entries.append(entry)
