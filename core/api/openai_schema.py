"""The OpenAI wire format: request bodies in, response bodies and stream chunks out.

Parsing turns a JSON body into a :class:`CompletionCall` (a :class:`GenerationRequest`
plus what the reply needs) or raises :class:`ApiError`, which the server sends as
``{"error": {"message", "type", "param", "code"}}``. No HTTP and no engine here: plain
values only, so every rule is easy to test on its own.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from core.engine.types import ChatMessage, GenerationRequest, RequestStats, SamplingParams

MAX_STOPS = 16
MAX_SESSION_CHARS = 256
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MODEL_ALIASES = ("default",)


class ApiError(Exception):
    """A request the server refuses, as OpenAI reports it."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def invalid(param: str | None, message: str, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class ModelCard:
    """What the server says about the loaded model."""

    id: str
    fingerprint: str
    context_length: int
    aliases: frozenset[str]
    created: int


@dataclass(frozen=True)
class CompletionCall:
    """A parsed ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` request."""

    chat: bool
    request: GenerationRequest
    stream: bool
    include_usage: bool


# ------------------------------------------------------------------ parsing
def _typed(body: dict, name: str, kinds: tuple[type, ...], what: str, default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise invalid(name, f"'{name}' must be {what}", code="invalid_type")
    return value


def _number(body: dict, name: str, default: float, low: float, high: float,
            low_open: bool = False) -> float:
    value = float(_typed(body, name, (int, float), "a number", default))
    if not math.isfinite(value):
        raise invalid(name, f"'{name}' must be a finite number, got {value}")
    if value < low or (low_open and value == low) or value > high:
        bracket = "(" if low_open else "["
        raise invalid(name, f"'{name}' must be in {bracket}{low:g}, {high:g}], got {value:g}")
    return value


def _max_tokens(body: dict, context_length: int) -> int:
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = _typed(body, name, (int,), "an integer", context_length)
    if value < 1:
        raise invalid(name, f"'{name}' must be at least 1, got {value}")
    if value > context_length:
        raise invalid(name, f"'{name}' is too large: {value}; this model has a context of "
                            f"{context_length} tokens")
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid("stop", "'stop' must be a string or a list of strings", code="invalid_type")
    if len(stop) > MAX_STOPS:
        raise invalid("stop", f"'stop' takes at most {MAX_STOPS} strings")
    return tuple(s for s in stop if s)


def _refuse_unsupported(body: dict) -> None:
    n = _typed(body, "n", (int,), "an integer", 1)
    if n != 1:
        raise invalid("n", "only n=1 is supported")
    for name in ("presence_penalty", "frequency_penalty"):
        if _typed(body, name, (int, float), "a number", 0) != 0:
            raise invalid(name, f"'{name}' is not supported; use 'repetition_penalty'")
    if body.get("logprobs") not in (None, False):
        raise invalid("logprobs", "logprobs are not supported")
    if body.get("tools") or body.get("functions"):
        raise invalid("tools", "tool calling is not supported")
    if body.get("echo"):
        raise invalid("echo", "echo is not supported")
    if _typed(body, "best_of", (int,), "an integer", 1) != 1:
        raise invalid("best_of", "only best_of=1 is supported")
    if body.get("suffix"):
        raise invalid("suffix", "suffix is not supported")


def sampling_params(body: dict, context_length: int) -> SamplingParams:
    """OpenAI's defaults (temperature 1, top_p 1, up to the context), plus mlx-lm's extras."""
    top_k = _typed(body, "top_k", (int,), "an integer", 0)
    if top_k < 0:
        raise invalid("top_k", "'top_k' must be >= 0")
    return SamplingParams(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=top_k,
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, 10.0, low_open=True),
        seed=_seed(body),
        max_tokens=_max_tokens(body, context_length),
        stop=_stop(body),
    )


def _seed(body: dict) -> int | None:
    seed = _typed(body, "seed", (int,), "an integer")
    if seed is not None and not 0 <= seed < 2**64:
        raise invalid("seed", f"'seed' must be in [0, 2^64 - 1], got {seed}")
    return seed


def _content(message: dict, index: int) -> str:
    content = message.get("content")
    param = f"messages[{index}].content"
    if content is None:
        if message.get("role") == "assistant":
            return ""
        raise invalid(param, f"'{param}' is required", code="missing_required_parameter")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(param, f"'{param}' may only hold text parts")
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(param, f"'{param}' must be a string or a list of text parts", code="invalid_type")


def chat_messages(body: dict) -> tuple[ChatMessage, ...]:
    messages = body.get("messages")
    if messages is None:
        raise invalid("messages", "'messages' is required", code="missing_required_parameter")
    if not isinstance(messages, list):
        raise invalid("messages", "'messages' must be a list", code="invalid_type")
    if not messages:
        raise invalid("messages", "'messages' must not be empty")
    parsed = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages[{i}]", f"'messages[{i}]' must be an object", code="invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"messages[{i}].role", f"unsupported role {role!r} (use one of "
                                                 f"{', '.join(ROLES)})")
        parsed.append(ChatMessage(ROLES[role], _content(message, i)))
    return tuple(parsed)


def _prompt(body: dict) -> tuple[str | None, tuple[int, ...] | None]:
    """A completion prompt: one string, or one list of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt, None
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                   and t >= 0 for t in prompt):
        return None, tuple(prompt)
    if prompt is None:
        raise invalid("prompt", "'prompt' is required", code="missing_required_parameter")
    if prompt == "":
        raise invalid("prompt", "'prompt' must not be empty")
    raise invalid("prompt", "'prompt' must be a string or a list of token ids (one prompt per request)",
                  code="invalid_type")


def check_model(body: dict, card: ModelCard) -> None:
    model = _typed(body, "model", (str,), "a string")
    if model and model not in card.aliases:
        raise ApiError(404, f"the model '{model}' does not exist; this server serves '{card.id}'",
                       param="model", code="model_not_found")


def session_name(body: dict, header: str | None) -> str | None:
    session = _typed(body, "session", (str,), "a string") or header or None
    if session is not None and len(session) > MAX_SESSION_CHARS:
        raise invalid("session", f"a session name has at most {MAX_SESSION_CHARS} characters")
    return session


def parse_call(body: Any, chat: bool, card: ModelCard, session_header: str | None = None) -> CompletionCall:
    """Validate a completion request body; raise :class:`ApiError` on the first problem."""
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object", code="invalid_type")
    check_model(body, card)
    _refuse_unsupported(body)
    stream = _typed(body, "stream", (bool,), "a boolean", False)
    options = _typed(body, "stream_options", (dict,), "an object", {})
    include_usage = _typed(options, "include_usage", (bool,), "a boolean", False)
    sampling = sampling_params(body, card.context_length)
    session = session_name(body, session_header)
    if chat:
        request = GenerationRequest(messages=chat_messages(body), sampling=sampling, session=session)
    else:
        text, tokens = _prompt(body)
        request = GenerationRequest(prompt_text=text, prompt_tokens=tokens, sampling=sampling,
                                    session=session)
    return CompletionCall(chat, request, stream, include_usage)


# ------------------------------------------------------------------ responses
def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(stats: RequestStats) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens + stats.restored_tokens},
    }


def finish_reason(stats: RequestStats) -> str:
    return "length" if stats.finish_reason == "length" else "stop"


class ReplyBuilder:
    """Bodies and stream chunks of one reply, all with the same id and creation time."""

    def __init__(self, call: CompletionCall, card: ModelCard):
        self.chat = call.chat
        self.id = new_id(call.chat)
        self.created = int(time.time())
        self.card = card

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.card.id,
                "system_fingerprint": self.card.fingerprint[:16]}

    def full(self, text: str, stats: RequestStats) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish_reason(stats)}
            body = self._envelope("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(stats)}
            body = self._envelope("text_completion")
        return {**body, "choices": [choice], "usage": usage(stats)}

    def chunk(self, text: str | None = None, stats: RequestStats | None = None,
              first: bool = False) -> dict[str, Any]:
        """A stream chunk: the first (chat: the role), a piece of text, or the last (``stats``)."""
        reason = finish_reason(stats) if stats is not None else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            body = self._envelope("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            body = self._envelope("text_completion")
        return {**body, "choices": [choice]}

    def usage_chunk(self, stats: RequestStats) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._envelope(obj), "choices": [], "usage": usage(stats)}
