"""Plain values that cross threads between the engine and its clients.

Nothing here imports mlx: the GUI, the HTTP server and the CLI build requests and
read events with these types only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from core.errors import ErrorKind


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` is greedy."""

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class GenerationRequest:
    """One request: chat messages (rendered with the model's chat template) or raw text
    or token ids. ``session`` names the chat whose cache this request extends."""

    messages: tuple[ChatMessage, ...] = ()
    prompt_text: str | None = None
    prompt_tokens: tuple[int, ...] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    session: str | None = None
    use_cache: bool = True


@dataclass(frozen=True)
class RequestStats:
    """What one request cost. Drives the cache panel, the API's usage and the benchmarks."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # served from the RAM cache
    restored_tokens: int = 0  # restored from the disk cache
    computed_tokens: int = 0  # prefilled by the model
    completion_tokens: int = 0
    ttft_s: float = 0.0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    total_s: float = 0.0
    finish_reason: str = "stop"  # "stop" | "length" | "cancelled"
    stop_sequence: str | None = None  # the stop string that ended the reply (finish_reason "stop")


@dataclass(frozen=True)
class TokenEvent:
    text: str
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ProgressEvent:
    """Prefill progress: ``done`` of ``total`` prompt tokens computed."""

    done: int
    total: int


@dataclass(frozen=True)
class DoneEvent:
    text: str
    stats: RequestStats


@dataclass(frozen=True)
class ErrorEvent:
    """A request ended in failure: ``kind`` says what failed, ``message`` (one line) says it
    in words. Front ends map the kind, never the words."""

    message: str  # one line
    kind: ErrorKind = ErrorKind.BAD_REQUEST

    @property
    def user_error(self) -> bool:
        """True for what the user can act on; False for a bug (logged with its traceback)."""
        return self.kind is not ErrorKind.INTERNAL


Event = Union[TokenEvent, ProgressEvent, DoneEvent, ErrorEvent]
