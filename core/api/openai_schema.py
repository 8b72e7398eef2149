"""The OpenAI wire format: request bodies (pydantic models) in, response bodies and stream
chunks out.

FastAPI validates a body against :class:`ChatCompletionRequest` or
:class:`CompletionRequest` (types, ranges, required fields: a 400 naming the field);
:func:`to_call` then checks what needs the loaded model (its name, its context) and turns
the body into a :class:`CompletionCall`: a :class:`GenerationRequest` plus what the reply
needs. No HTTP and no engine here: plain values only, so every rule is easy to test on
its own.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from core.api.errors import ApiError, invalid
from core.api.limits import DEFAULT_REQUEST_LIMITS, RequestLimits
from core.api.openai_tools import (
    ResponseFormat,
    ToolCallIn,
    ToolChoice,
    ToolDef,
    call_object,
    check_tool_message,
    message_calls,
    tool_fields,
)
from core.api.reasoning import effort_kwargs, template_kwargs
from core.api.wire import (
    CACHE_SALT_TEXT,
    MAX_PRIORITY,
    MAX_SALT_CHARS,
    MAX_SESSION_CHARS,
    MODEL_ALIASES,
    PRIORITY_HEADER,
    ModelCard,
    RadixChatOptions,
    Text,
    WireModel,
)
from core.engine.namespaces import with_salt
from core.engine.types import ChatMessage, GenerationRequest, RequestStats, SamplingParams, ToolCall
from core.models.base_models import BASE_LABEL

__all__ = [
    "ApiError",
    "ChatCompletionRequest",
    "CompletionCall",
    "CompletionRequest",
    "MODEL_ALIASES",
    "ModelCard",
    "ReplyBuilder",
    "to_call",
]

MAX_STOPS = 16
MAX_TOP_K = 2**31 - 1
ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
TokenId = Annotated[int, Field(ge=0)]


# ------------------------------------------------------------------ request bodies
def unsupported(
    *fields: str, message: str = "not supported", allowed: tuple = (None, False, 0, "")
):
    """A validator for a body's ``fields``: a value other than ``allowed`` (by default
    the field's absent or empty values) is refused with ``message`` (a 400 naming the
    field). Assigned to a name in the body's class, as pydantic collects validators."""

    def check(cls, value):
        if value not in allowed:
            raise ValueError(message)
        return value

    return field_validator(*fields)(classmethod(check))


class TextPart(WireModel):
    type: Literal["text"]
    text: Text


class Message(WireModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallIn] | None = Field(
        None, description="the calls an assistant message made"
    )
    tool_call_id: Text | None = Field(None, description="the call a tool message answers")
    reasoning_content: Text | None = Field(
        None, description="an assistant message's thinking, as a reply gave it (llama.cpp, vLLM)"
    )
    reasoning: Any = Field(
        None,
        description="the same, under vLLM's newer name (as text; other shapes, as some "
        "services send, are ignored)",
    )

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(WireModel):
    include_usage: bool | None = None


class SamplingFields(WireModel):
    """Fields every OpenAI generation endpoint takes (``/v1/chat/completions``,
    ``/v1/completions``, ``/v1/responses``): OpenAI's sampling, mlx-lm's extras and ours
    (``session``, ``cache_salt``, ``priority``)."""

    model: Text | None = None
    temperature: float | None = Field(None, ge=0, le=2, description="0 is greedy (default 1)")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K, description="0: off (mlx-lm extra)")
    min_p: float | None = Field(None, ge=0, le=1, description="mlx-lm extra")
    repetition_penalty: float | None = Field(None, gt=0, le=10, description="mlx-lm extra")
    seed: int | None = Field(None, ge=0, lt=2**64)
    stream: bool | None = None
    session: Text | None = Field(
        None,
        max_length=MAX_SESSION_CHARS,
        description="the chat session whose cache this request extends "
        "(or the X-RadixChat-Session header)",
    )
    cache_salt: Text | None = Field(
        None,
        min_length=1,
        max_length=MAX_SALT_CHARS,
        description=CACHE_SALT_TEXT + " (as vLLM's API)",
    )
    priority: int | None = Field(
        None,
        ge=0,
        le=MAX_PRIORITY,
        description="vLLM's: lower is prefilled sooner; 0 (default) or more, the "
        "app's own chat goes first (or the X-RadixChat-Priority header)",
    )
    user: Text | None = None
    radixchat: RadixChatOptions | None = Field(
        None, description="RadixChat's own options (speculative: off, ngram or draft)"
    )


class _Sampling(SamplingFields):
    """Fields both legacy endpoints take (chat and text completions)."""

    max_tokens: int | None = Field(
        None, ge=1, description="default: the server's --max-output-tokens"
    )
    stop: Text | list[Text] | None = Field(None, description=f"at most {MAX_STOPS} strings")
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream_options: StreamOptions | None = None

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop):
        if isinstance(stop, list) and len(stop) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        return stop

    _one_choice = unsupported("n", message="only n=1 is supported", allowed=(None, 1))
    _no_penalty = unsupported(
        "presence_penalty", "frequency_penalty", message="not supported; use 'repetition_penalty'"
    )


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    tools: list[ToolDef] | None = Field(
        None, description="functions the model may call (to the chat template)"
    )
    tool_choice: ToolChoice | None = Field(
        None,
        description="auto (default), none, required, or a named "
        "function; required and named constrain decoding",
    )
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = Field(
        None, description="json_object or json_schema: constrained decoding"
    )
    functions: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        None,
        description='variables for the chat template, e.g. {"enable_thinking": false} '
        "(as vLLM and llama.cpp take them)",
    )
    reasoning_effort: Text | None = Field(
        None, description="to the template as reasoning_effort; none: thinking off"
    )

    _no_logprobs = unsupported("logprobs", message="logprobs are not supported")


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: Text | list[TokenId] | list[Text] | list[list[TokenId]]
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: Text | None = None

    _no_logprobs = unsupported("logprobs", message="logprobs are not supported", allowed=(None,))
    _no_echo = unsupported("echo", "suffix")
    _one_best = unsupported("best_of", message="only best_of=1 is supported", allowed=(None, 1))


# ------------------------------------------------------------------ checks that need the model
@dataclass(frozen=True)
class CompletionCall:
    """A checked ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` request."""

    chat: bool
    request: GenerationRequest
    stream: bool
    include_usage: bool


def max_tokens(
    value: int | None,
    name: str,
    context_length: int,
    limits: RequestLimits = DEFAULT_REQUEST_LIMITS,
) -> int:
    """A reply's token limit: the request's own (up to the context), else the server's
    ceiling (``radixchat serve --max-output-tokens``)."""
    if value is None:
        return limits.default_reply_tokens(context_length)
    if value > context_length:
        raise invalid(
            name,
            f"'{name}' is too large: {value}; this model has a context of {context_length} tokens",
        )
    return value


def header_text(name: str, value: str | None) -> str | None:
    """A header as UTF-8 text (Starlette hands us its bytes as latin-1)."""
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise invalid(name, f"the {name} header is not valid UTF-8") from None


def session_name(body_session: str | None, header: str | None) -> str | None:
    session = body_session or header_text("X-RadixChat-Session", header) or None
    if session is not None and len(session) > MAX_SESSION_CHARS:
        raise invalid("session", f"a session name has at most {MAX_SESSION_CHARS} characters")
    return session


def priority_of(body_priority: int | None, header: str | None) -> int:
    """The request's place among waiting requests: the body's ``priority`` or the
    X-RadixChat-Priority header, 0 without either. A client may only ask to wait longer
    (0 or more): the app's own chat window goes before every API request."""
    if body_priority is not None:
        return body_priority
    text = header_text(PRIORITY_HEADER, header)
    if text is None or not text.strip():
        return 0
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_PRIORITY:
        raise invalid(
            PRIORITY_HEADER,
            f"the {PRIORITY_HEADER} header must be a whole number from 0 to "
            f"{MAX_PRIORITY} (lower is sooner)",
        )
    return value


def speculative_of(options: RadixChatOptions | None) -> str | None:
    """The body's ``radixchat.speculative`` (None: the server's setting)."""
    return options.speculative if options is not None else None


def sampling_params(
    body: SamplingFields, limit: int, stop: str | list[str] | None = None
) -> SamplingParams:
    """OpenAI's defaults (temperature 1, top_p 1, up to ``limit`` tokens), plus mlx-lm's
    extras; ``stop``: the body's stop strings, where its endpoint takes them."""
    stop = [stop] if isinstance(stop, str) else stop or []
    return SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        min_p=body.min_p or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        seed=body.seed,
        max_tokens=limit,
        stop=tuple(s for s in stop if s),
    )


def _prompt(prompt: str | list) -> tuple[str | None, tuple[int, ...] | None]:
    """A completion prompt: one string, or one list of token ids (or a batch of one of them)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if prompt == "" or prompt == []:
        raise invalid("prompt", "'prompt' must not be empty")
    if isinstance(prompt, str):
        return prompt, None
    if all(isinstance(t, int) for t in prompt):
        return None, tuple(prompt)
    raise invalid(
        "prompt",
        "'prompt' must be a string or a list of token ids (one prompt per request)",
        code="invalid_type",
    )


def chat_messages(messages: list[Message]) -> tuple[ChatMessage, ...]:
    """The engine's messages: an assistant message's tool calls, a tool message's result with
    the call it answers (which must be an earlier call: a 400 naming the field otherwise)."""
    out, calls = [], {}
    for i, message in enumerate(messages):
        if message.content is None and message.role != "assistant":
            raise invalid(
                f"messages[{i}].content",
                f"'messages[{i}].content' is required",
                code="missing_required_parameter",
            )
        made = message_calls(message.tool_calls) if message.role == "assistant" else ()
        other = message.reasoning if isinstance(message.reasoning, str) else ""
        thought = message.reasoning_content or other
        calls.update({call.id: call.name for call in made})
        if message.role == "tool":
            name = check_tool_message(i, message.tool_call_id, calls)
            out.append(
                ChatMessage("tool", message.text(), tool_call_id=message.tool_call_id, name=name)
            )
        else:
            thought = thought if message.role == "assistant" else ""
            out.append(ChatMessage(ROLES[message.role], message.text(), made, reasoning=thought))
    return tuple(out)


def to_call(
    body: ChatCompletionRequest | CompletionRequest,
    card: ModelCard,
    session_header: str | None = None,
    namespace: str = "",
    priority_header: str | None = None,
    limits: RequestLimits = DEFAULT_REQUEST_LIMITS,
) -> CompletionCall:
    """The engine request for a validated body, in cache namespace ``namespace`` (the API
    key's) split by the body's ``cache_salt``; raise :class:`ApiError` for what the loaded
    model refuses (or what is past the request ``limits``)."""
    # any model name is served by the loaded model (the reply names it), as llama.cpp does
    chat = isinstance(body, ChatCompletionRequest)
    session = session_name(body.session, session_header)
    namespace = with_salt(namespace, body.cache_salt)
    priority = priority_of(body.priority, priority_header)
    if chat:
        if body.functions:
            raise invalid("functions", "'functions' is deprecated and not supported; use 'tools'")
        extra = tool_fields(body.tools, body.tool_choice, body.response_format, limits)
        if body.max_completion_tokens is not None:
            limit = max_tokens(
                body.max_completion_tokens, "max_completion_tokens", card.context_length, limits
            )
        else:
            limit = max_tokens(body.max_tokens, "max_tokens", card.context_length, limits)
        request = GenerationRequest(
            messages=chat_messages(body.messages),
            sampling=sampling_params(body, limit, body.stop),
            session=session,
            cache_namespace=namespace,
            priority=priority,
            speculative=speculative_of(body.radixchat),
            template_kwargs={
                **effort_kwargs(body.reasoning_effort),
                **template_kwargs(body.chat_template_kwargs, "chat_template_kwargs"),
            },
            **extra,
        )
    else:
        limit = max_tokens(body.max_tokens, "max_tokens", card.context_length, limits)
        text, tokens = _prompt(body.prompt)
        request = GenerationRequest(
            prompt_text=text,
            prompt_tokens=tokens,
            sampling=sampling_params(body, limit, body.stop),
            session=session,
            cache_namespace=namespace,
            priority=priority,
            speculative=speculative_of(body.radixchat),
        )
    options = body.stream_options or StreamOptions()
    return CompletionCall(chat, request, bool(body.stream), bool(options.include_usage))


# ------------------------------------------------------------------ responses
def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(stats: RequestStats) -> dict[str, Any]:
    thinking = (
        {"completion_tokens_details": {"reasoning_tokens": stats.reasoning_tokens}}
        if stats.reasoning_tokens
        else {}
    )
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens + stats.restored_tokens},
        **thinking,
        **usage_extra(stats),
    }


def usage_extra(stats: RequestStats) -> dict[str, Any]:
    """RadixChat's figures beside a usage object (both dialects): the cache namespace the
    prompt was looked up in, how much of the hit came from RAM and from disk, and, for a
    reply decoded with speculation, its draft tokens proposed and accepted."""
    extra: dict[str, Any] = {}
    if stats.cache_namespace:
        extra.update(
            cache_namespace=stats.cache_namespace,
            ram_tokens=stats.cached_tokens,
            disk_tokens=stats.restored_tokens,
        )
    if stats.draft_tokens:
        extra.update(
            draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens,
            tokens_per_step=round(stats.tokens_per_step, 3),
        )
    return {"radixchat": extra} if extra else {}


def finish_reason(stats: RequestStats) -> str:
    return stats.finish_reason if stats.finish_reason in ("length", "tool_calls") else "stop"


def model_object(card: ModelCard, name: str | None = None) -> dict[str, Any]:
    """The loaded model as /v1/models lists it, under ``name`` (an alias) or its id."""
    return {
        "id": name or card.id,
        "object": "model",
        "created": card.created,
        "owned_by": "radixchat",
        "radixchat": {
            "fingerprint": card.fingerprint,
            "context_length": card.context_length,
            "base_model": card.base,
            **({"note": BASE_LABEL} if card.base else {}),
            **(
                {
                    "cache": {
                        "cached_as": card.cached_as,
                        "layout": card.cache_layout,
                        "kv_format": dict(card.kv_format),
                    }
                }
                if card.cached_as
                else {}
            ),
        },
    }


class ReplyBuilder:
    """Bodies and stream chunks of one reply, all with the same id and creation time."""

    def __init__(self, call: CompletionCall, card: ModelCard):
        self.chat = call.chat
        self.id = new_id(call.chat)
        self.created = int(time.time())
        self.card = card
        self.calls_sent = 0  # tool calls streamed so far (their index in delta.tool_calls)

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.card.id,
            "system_fingerprint": self.card.fingerprint[:16],
        }

    def full(
        self,
        text: str,
        stats: RequestStats,
        tool_calls: tuple[ToolCall, ...] = (),
        reasoning: str = "",
    ) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text or (None if tool_calls else ""),
            }
            if reasoning:
                message["reasoning_content"] = reasoning
            if tool_calls:
                message["tool_calls"] = [call_object(call) for call in tool_calls]
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason(stats),
            }
            body = self._envelope("chat.completion")
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason(stats),
            }
            body = self._envelope("text_completion")
        return {**body, "choices": [choice], "usage": usage(stats)}

    def chunk(
        self,
        text: str | None = None,
        stats: RequestStats | None = None,
        first: bool = False,
        tool_call: ToolCall | None = None,
        reasoning: str | None = None,
    ) -> dict[str, Any]:
        """A stream chunk: the first (chat: the role), a piece of text, a piece of the
        thinking (``delta.reasoning_content``), a tool call (whole, in ``delta.tool_calls``),
        or the last (``stats``)."""
        reason = finish_reason(stats) if stats is not None else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            if reasoning:
                delta["reasoning_content"] = reasoning
            if tool_call is not None:
                delta["tool_calls"] = [call_object(tool_call, self.calls_sent)]
                self.calls_sent += 1
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            body = self._envelope("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            body = self._envelope("text_completion")
        return {**body, "choices": [choice]}

    def usage_chunk(self, stats: RequestStats) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._envelope(obj), "choices": [], "usage": usage(stats)}
