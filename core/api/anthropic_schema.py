"""The Anthropic Messages wire format: ``POST /v1/messages`` and ``/v1/messages/count_tokens``
bodies (pydantic models) in, messages and stream events out.

Like :mod:`core.api.openai_schema`: FastAPI validates a body against
:class:`MessagesRequest`; :func:`to_call` checks what needs the loaded model and turns it
into a :class:`MessagesCall`; :class:`MessageBuilder` writes the replies. Whatever model a
client names (``claude-...``) is served by the loaded model, as LM Studio and Ollama do.

Usage: Anthropic splits the prompt into ``input_tokens`` (computed now),
``cache_creation_input_tokens`` and ``cache_read_input_tokens``; ours are the tokens the
model computed and the tokens the prefix cache served (RAM or disk). The cache is written
as a side effect, so nothing counts as a cache creation.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator

from core.api.errors import ApiError, invalid
from core.api.openai_schema import MAX_STOPS, max_tokens, session_name
from core.api.wire import ModelCard, Text, WireModel
from core.engine.types import ChatMessage, GenerationRequest, RequestStats, SamplingParams

BLOCK_JOIN = "\n\n"  # text blocks of one message (or of the system prompt) become one text


# ------------------------------------------------------------------ request bodies
class TextBlock(WireModel):
    type: Literal["text"]
    text: Text
    cache_control: dict[str, Any] | None = Field(None, description="accepted; every prefix is cached")


class ToolUseBlock(WireModel):
    type: Literal["tool_use"]
    id: Text
    name: Text
    input: dict[str, Any]


class ToolResultBlock(WireModel):
    type: Literal["tool_result"]
    tool_use_id: Text
    content: Text | list[TextBlock] | None = None
    is_error: bool | None = None


_BLOCK_TAGS = {"text": "TextBlock", "tool_use": "ToolUseBlock", "tool_result": "ToolResultBlock"}


def _block_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return _BLOCK_TAGS.get(kind) if isinstance(kind, str) else None


# Tagged by the class names (not the "type" values): an error's location then reads
# messages[0].content[1].text, never messages[0].content[1].text.text
ContentBlock = Annotated[
    Union[Annotated[TextBlock, Tag("TextBlock")], Annotated[ToolUseBlock, Tag("ToolUseBlock")],
          Annotated[ToolResultBlock, Tag("ToolResultBlock")]],
    Discriminator(_block_tag, custom_error_type="invalid_block",
                  custom_error_message=f"a content block's type is one of {', '.join(_BLOCK_TAGS)}"),
]


class Message(WireModel):
    role: Literal["user", "assistant"]
    content: Text | list[ContentBlock]


class Metadata(WireModel):
    user_id: Text | None = None


class CountTokensRequest(WireModel):
    """``POST /v1/messages/count_tokens``."""

    model: Text
    messages: list[Message] = Field(min_length=1)
    system: Text | list[TextBlock] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[Text] | None = Field(None, max_length=MAX_STOPS)
    stream: bool | None = None
    temperature: float | None = Field(None, ge=0, le=1, description="0 is greedy (default 1)")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=2**31 - 1)
    metadata: Metadata | None = None
    session: Text | None = Field(None, description="RadixChat: the chat session whose cache this request "
                                                   "extends (or the X-RadixChat-Session header)")

    @field_validator("stop_sequences")
    @classmethod
    def _no_empty_stop(cls, stops):
        if stops is not None and any(not s for s in stops):
            raise ValueError("a stop sequence may not be empty")
        return stops


# ------------------------------------------------------------------ checks that need the model
@dataclass(frozen=True)
class MessagesCall:
    request: GenerationRequest
    model: str  # the name the client used: replies echo it
    stream: bool


def check_model(model: str, card: ModelCard) -> None:
    if model not in card.aliases and not model.startswith("claude"):
        raise ApiError(404, f"the model '{model}' does not exist; this server serves '{card.id}' "
                            "(and answers to any claude-... name)", param="model", code="model_not_found")


def _text(content: str | list | None, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for i, block in enumerate(content):
        if not isinstance(block, TextBlock):
            raise invalid(f"{param}[{i}]", f"{block.type} blocks need tool support, which "
                                           "this server does not have yet", code="unsupported_value")
        texts.append(block.text)
    return BLOCK_JOIN.join(texts)


def chat_messages(body: CountTokensRequest) -> tuple[ChatMessage, ...]:
    if body.tools or body.tool_choice:
        name = "tools" if body.tools else "tool_choice"
        raise invalid(name, f"{name}: tool use is not supported by this server yet", code="unsupported_value")
    messages = []
    system = _text(body.system, "system")
    if system:
        messages.append(ChatMessage("system", system))
    for i, message in enumerate(body.messages):
        messages.append(ChatMessage(message.role, _text(message.content, f"messages[{i}].content")))
    if body.messages[-1].role == "assistant":
        raise invalid(f"messages[{len(body.messages) - 1}]", "a final assistant message (a prefill to "
                      "continue) is not supported: end with a user message", code="unsupported_value")
    return tuple(messages)


def to_call(body: MessagesRequest, card: ModelCard, session_header: str | None = None) -> MessagesCall:
    check_model(body.model, card)
    sampling = SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        max_tokens=max_tokens(body.max_tokens, "max_tokens", card.context_length),
        stop=tuple(body.stop_sequences or ()),
    )
    request = GenerationRequest(messages=chat_messages(body), sampling=sampling,
                                session=session_name(body.session, session_header))
    return MessagesCall(request, body.model, bool(body.stream))


def count_request(body: CountTokensRequest, card: ModelCard) -> GenerationRequest:
    check_model(body.model, card)
    return GenerationRequest(messages=chat_messages(body))


# ------------------------------------------------------------------ replies
def model_object(card: ModelCard, name: str | None = None) -> dict[str, Any]:
    """The loaded model as Anthropic's ``/v1/models`` lists one (``name``: the name asked for)."""
    created = datetime.fromtimestamp(card.created, timezone.utc).isoformat().replace("+00:00", "Z")
    return {"type": "model", "id": name or card.id, "display_name": card.id, "created_at": created,
            "lifecycle": "active", "max_input_tokens": card.context_length}


def model_list(card: ModelCard) -> dict[str, Any]:
    return {"data": [model_object(card)], "has_more": False, "first_id": card.id, "last_id": card.id}


def stop_reason(stats: RequestStats) -> str:
    if stats.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stats.stop_sequence is not None else "end_turn"


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached_tokens}


def final_usage(stats: RequestStats) -> dict[str, int]:
    return usage(stats.prompt_tokens, stats.cached_tokens + stats.restored_tokens, stats.completion_tokens)


class MessageBuilder:
    """The message and stream events of one reply, all with the same id."""

    def __init__(self, call: MessagesCall):
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model = call.model

    def full(self, text: str, stats: RequestStats) -> dict[str, Any]:
        content = [{"type": "text", "text": text}] if text else []  # as Anthropic: no empty blocks
        return {**self._message(content, stop_reason(stats), stats.stop_sequence),
                "usage": final_usage(stats)}

    def _message(self, content: list, reason: str | None, sequence: str | None) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": reason, "stop_sequence": sequence}

    def start(self, prompt_tokens: int, cached_tokens: int) -> dict[str, Any]:
        return {"type": "message_start", "message": {**self._message([], None, None),
                                                     "usage": usage(prompt_tokens, cached_tokens, 0)}}

    @staticmethod
    def block_start(index: int = 0) -> dict[str, Any]:
        return {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}

    @staticmethod
    def text_delta(text: str, index: int = 0) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}

    @staticmethod
    def block_stop(index: int = 0) -> dict[str, Any]:
        return {"type": "content_block_stop", "index": index}

    @staticmethod
    def delta(stats: RequestStats) -> dict[str, Any]:
        return {"type": "message_delta", "delta": {"stop_reason": stop_reason(stats),
                                                   "stop_sequence": stats.stop_sequence},
                "usage": final_usage(stats)}
