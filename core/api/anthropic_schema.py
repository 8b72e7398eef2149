"""The Anthropic Messages wire format: ``POST /v1/messages`` and ``/v1/messages/count_tokens``
bodies (pydantic models) in, messages and stream events out.

Like :mod:`core.api.openai_schema`: FastAPI validates a body against
:class:`MessagesRequest`; :func:`to_call` checks what needs the loaded model and turns it
into a :class:`MessagesCall`; :class:`MessageBuilder` writes the replies. Whatever model a
client names (``claude-...``) is served by the loaded model, as LM Studio and Ollama do.

Tools: Anthropic's ``tools`` (``name``, ``input_schema``) reach the engine in the OpenAI
shape chat templates take; ``tool_choice`` ``auto`` / ``any`` / ``tool`` / ``none`` is the
engine's ``auto`` / ``required`` / ``function`` / ``none`` (the forced ones decode under a
grammar, so the call is valid JSON for the tool's schema). An assistant message's
``tool_use`` blocks become its tool calls; a user message's ``tool_result`` blocks become
"tool" messages, each answering a call of the assistant message before it, by id.

Thinking: a reasoning model's thinking comes back as a ``thinking`` block before the text
when the request enables ``thinking`` (its ``signature`` a digest, never checked), and not
at all otherwise, as Anthropic's API; the switch reaches the template as
``enable_thinking`` (:mod:`core.api.reasoning`). ``thinking`` blocks sent back in an
assistant message are its reasoning; ``redacted_thinking`` ones are dropped.

Usage: Anthropic splits the prompt into ``input_tokens`` (computed now),
``cache_creation_input_tokens`` and ``cache_read_input_tokens``; ours are the tokens the
model computed and the tokens the prefix cache served (RAM or disk). The cache is written
as a side effect, so nothing counts as a cache creation.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator

from core.api.errors import invalid
from core.api.limits import DEFAULT_REQUEST_LIMITS, RequestLimits
from core.api.openai_schema import (
    MAX_STOPS,
    priority_of,
    session_name,
    speculative_of,
    usage_extra,
)
from core.api.reasoning import thinking_kwargs
from core.api.wire import (
    CACHE_SALT_TEXT,
    MAX_PRIORITY,
    MAX_SALT_CHARS,
    ModelCard,
    RadixChatOptions,
    Text,
    WireModel,
)
from core.engine.constrain import SchemaError, check_schema
from core.engine.namespaces import with_salt
from core.engine.types import ChatMessage, GenerationRequest, RequestStats, SamplingParams, ToolCall
from core.models.base_models import BASE_LABEL

BLOCK_JOIN = "\n\n"  # text blocks of one message (or of the system prompt) become one text
BILLING_HEADER = "x-anthropic-billing-header:"  # Claude Code's first system block: dropped


# ------------------------------------------------------------------ request bodies
class TextBlock(WireModel):
    type: Literal["text"]
    text: Text
    cache_control: dict[str, Any] | None = Field(
        None, description="accepted; every prefix is cached"
    )


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


class ThinkingBlock(WireModel):
    """A thinking block of an earlier reply, sent back: its text is the assistant message's
    reasoning (templates that keep thinking render it); its signature is not checked."""

    type: Literal["thinking"]
    thinking: Text
    signature: Text | None = None


class RedactedThinkingBlock(WireModel):
    """Anthropic's encrypted thinking, sent back: accepted and dropped (no model here made it)."""

    type: Literal["redacted_thinking"]
    data: Text | None = None


_BLOCK_TAGS = {
    "text": "TextBlock",
    "tool_use": "ToolUseBlock",
    "tool_result": "ToolResultBlock",
    "thinking": "ThinkingBlock",
    "redacted_thinking": "RedactedThinkingBlock",
}


def _block_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return _BLOCK_TAGS.get(kind) if isinstance(kind, str) else None


# Tagged by the class names (not the "type" values): an error's location then reads
# messages[0].content[1].text, never messages[0].content[1].text.text
ContentBlock = Annotated[
    Annotated[TextBlock, Tag("TextBlock")]
    | Annotated[ToolUseBlock, Tag("ToolUseBlock")]
    | Annotated[ToolResultBlock, Tag("ToolResultBlock")]
    | Annotated[ThinkingBlock, Tag("ThinkingBlock")]
    | Annotated[RedactedThinkingBlock, Tag("RedactedThinkingBlock")],
    Discriminator(
        _block_tag,
        custom_error_type="invalid_block",
        custom_error_message=f"a content block's type is one of {', '.join(_BLOCK_TAGS)}",
    ),
]


class Message(WireModel):
    # "system": a system message mid-conversation (Claude Code 2.1 sends them, beta
    # mid-conversation-system): it goes in as user text where it stands
    role: Literal["user", "assistant", "system"]
    content: Text | list[ContentBlock]


class Metadata(WireModel):
    user_id: Text | None = None
    cache_salt: Text | None = Field(
        None,
        min_length=1,
        max_length=MAX_SALT_CHARS,
        description="RadixChat: " + CACHE_SALT_TEXT + " (or the body's cache_salt)",
    )


class Tool(WireModel):
    """A tool the model may call (a client tool: Anthropic's own server tools are not run here)."""

    name: Text = Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")
    description: Text | None = None
    input_schema: dict[str, Any] = Field(description="JSON Schema of the tool's input")
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(WireModel):
    type: Literal["auto", "any", "tool", "none"]
    name: Text | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(WireModel):
    """``thinking``: ``enabled`` (``budget_tokens`` is accepted, not enforced), ``adaptive``
    or ``between_tools`` (or a type of a newer API version) switch a reasoning model's
    thinking on and return it as thinking blocks (``display: "omitted"``: the blocks come
    empty); ``disabled`` (as no ``thinking`` at all) switches it off where the template can,
    and no thinking block is returned."""

    type: Text
    budget_tokens: int | None = Field(None, ge=0)
    display: Literal["summarized", "omitted"] | None = None

    @property
    def enabled(self) -> bool:
        return self.type != "disabled"


class CountTokensRequest(WireModel):
    """``POST /v1/messages/count_tokens``."""

    model: Text
    messages: list[Message] = Field(min_length=1)
    system: Text | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[Text] | None = Field(None, max_length=MAX_STOPS)
    stream: bool | None = None
    temperature: float | None = Field(None, ge=0, le=1, description="0 is greedy (default 1)")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=2**31 - 1)
    metadata: Metadata | None = None
    session: Text | None = Field(
        None,
        description="RadixChat: the chat session whose cache this request "
        "extends (or the X-RadixChat-Session header)",
    )
    cache_salt: Text | None = Field(
        None,
        min_length=1,
        max_length=MAX_SALT_CHARS,
        description="RadixChat: " + CACHE_SALT_TEXT + " (or metadata.cache_salt)",
    )
    priority: int | None = Field(
        None,
        ge=0,
        le=MAX_PRIORITY,
        description="RadixChat: lower is prefilled sooner; 0 (default) or more "
        "(or the X-RadixChat-Priority header)",
    )
    radixchat: RadixChatOptions | None = Field(
        None, description="RadixChat's own options (speculative: off, ngram or draft)"
    )

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
    model: str  # the loaded model's id, which replies name (whatever name the client sent)
    stream: bool
    thinking: bool = False  # the reply's thinking goes out as thinking blocks
    thinking_shown: bool = True  # with its text (display "omitted": empty blocks)


def _text(content: str | list | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return BLOCK_JOIN.join(block.text for block in content)


def _user(message: Message, i: int, calls: dict[str, str]) -> list[ChatMessage]:
    """A user message: its tool results (each answering a call of the previous assistant
    message, by id) as "tool" messages, then its text."""
    if isinstance(message.content, str):
        return [ChatMessage("user", message.content)]
    results, texts = [], []
    for j, block in enumerate(message.content):
        where = f"messages[{i}].content[{j}]"
        if isinstance(block, (ToolUseBlock, ThinkingBlock, RedactedThinkingBlock)):
            raise invalid(where, f"a {block.type} block belongs in an assistant message")
        if isinstance(block, TextBlock):
            texts.append(block.text)
            continue
        if block.tool_use_id not in calls:
            raise invalid(
                f"{where}.tool_use_id",
                f"tool_result {block.tool_use_id!r} answers no tool_use "
                "block of the assistant message before it",
            )
        content = _text(block.content)
        results.append(
            ChatMessage(
                "tool",
                f"Error: {content}" if block.is_error else content,
                tool_call_id=block.tool_use_id,
                name=calls[block.tool_use_id],
            )
        )
    return results + ([ChatMessage("user", BLOCK_JOIN.join(texts))] if texts else [])


def _assistant(message: Message, i: int) -> ChatMessage:
    if isinstance(message.content, str):
        return ChatMessage("assistant", message.content)
    texts, calls, thoughts = [], [], []
    for j, block in enumerate(message.content):
        if isinstance(block, ToolResultBlock):
            raise invalid(
                f"messages[{i}].content[{j}]", "a tool_result block belongs in a user message"
            )
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thoughts.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append(
                ToolCall(block.id, block.name, json.dumps(block.input, ensure_ascii=False))
            )
    return ChatMessage(
        "assistant",
        BLOCK_JOIN.join(texts),
        tool_calls=tuple(calls),
        reasoning=BLOCK_JOIN.join(t for t in thoughts if t),
    )


def system_text(system: str | list[TextBlock] | None) -> str:
    """The system prompt's text, less Claude Code's per-request billing block: its 2.x sends
    ``x-anthropic-billing-header: ...`` as the first system block, different on every request,
    which would put a new token at the head of every prompt and so miss the prefix cache."""
    if isinstance(system, list):
        system = [block for block in system if not block.text.startswith(BILLING_HEADER)]
    return _text(system)


def chat_messages(body: CountTokensRequest) -> tuple[ChatMessage, ...]:
    messages = []
    system = system_text(body.system)
    if system:
        messages.append(ChatMessage("system", system))
    calls: dict[str, str] = {}  # the tool calls of the last assistant message: id -> tool name
    for i, message in enumerate(body.messages):
        if message.role == "assistant":
            messages.append(_assistant(message, i))
            calls = {call.id: call.name for call in messages[-1].tool_calls}
        elif message.role == "system":
            messages.append(ChatMessage("user", _system_message(message, i)))
        else:
            messages.extend(_user(message, i, calls))
            calls = {}
    if body.messages[-1].role == "assistant":
        raise invalid(
            f"messages[{len(body.messages) - 1}]",
            "a final assistant message (a prefill to "
            "continue) is not supported: end with a user message",
            code="unsupported_value",
        )
    return merged(messages)


def _system_message(message: Message, i: int) -> str:
    if isinstance(message.content, str):
        return message.content
    for j, block in enumerate(message.content):
        if not isinstance(block, TextBlock):
            raise invalid(f"messages[{i}].content[{j}]", "a system message holds text blocks only")
    return _text(message.content)


def merged(messages: list[ChatMessage]) -> tuple[ChatMessage, ...]:
    """Consecutive user (or assistant) messages as one, as Anthropic's API combines them
    (templates such as Gemma's refuse two user turns in a row); tool results stay apart."""
    out: list[ChatMessage] = []
    for message in messages:
        last = out[-1] if out else None
        if (
            last is not None
            and message.role == last.role
            and message.role in ("user", "assistant")
            and not (last.tool_calls and message.content)
        ):
            text = BLOCK_JOIN.join(t for t in (last.content, message.content) if t)
            thought = BLOCK_JOIN.join(t for t in (last.reasoning, message.reasoning) if t)
            out[-1] = ChatMessage(
                last.role, text, last.tool_calls + message.tool_calls, reasoning=thought
            )
        else:
            out.append(message)
    return tuple(out)


def tool_request(
    body: CountTokensRequest, limits: RequestLimits = DEFAULT_REQUEST_LIMITS
) -> dict[str, Any]:
    """The engine's tool fields for ``body``: tools in the OpenAI shape chat templates take,
    and the choice. Tools past the ``limits``, a schema that is not valid JSON Schema (or
    that the grammar library cannot enforce) or a choice naming no tool is a 400 naming the
    field."""
    tools = body.tools or []
    limits.check_body({"tools": tools})
    limits.check_schemas(tool.model_dump(exclude_none=True) for tool in tools)
    choice = body.tool_choice or ToolChoice(type="auto")
    for i, tool in enumerate(tools):
        # the same schemas come on every turn of an agent: checked once (check_schema
        # remembers); only a schema a call is forced into must fit the grammar library
        enforced = choice.type == "any" or (choice.type == "tool" and tool.name == choice.name)
        try:
            check_schema(tool.input_schema, f"tools[{i}].input_schema", enforced)
        except SchemaError as exc:
            raise invalid(exc.param, str(exc)) from None
    if choice.type in ("any", "tool") and not tools:
        raise invalid("tool_choice", f"tool_choice {choice.type!r} needs tools")
    if choice.type == "tool" and choice.name not in {tool.name for tool in tools}:
        raise invalid(
            "tool_choice.name", f"tool_choice names {choice.name!r}, which is not among the tools"
        )
    openai_tools = tuple(
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description or "",
                "parameters": tool.input_schema,
            },
        }
        for tool in tools
    )
    mode = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}[choice.type]
    return {
        "tools": openai_tools,
        "tool_choice": mode,
        "tool_name": choice.name if mode == "function" else None,
    }


def cache_salt(body: MessagesRequest) -> str | None:
    """The body's ``cache_salt``, or its ``metadata.cache_salt`` (where a client can only
    set metadata); both: they must agree."""
    inner = body.metadata.cache_salt if body.metadata is not None else None
    if body.cache_salt is not None and inner is not None and inner != body.cache_salt:
        raise invalid("cache_salt", "cache_salt and metadata.cache_salt differ: send one of them")
    return body.cache_salt or inner


def to_call(
    body: MessagesRequest,
    card: ModelCard,
    session_header: str | None = None,
    namespace: str = "",
    priority_header: str | None = None,
    limits: RequestLimits = DEFAULT_REQUEST_LIMITS,
) -> MessagesCall:
    """The engine request for a validated body, in cache namespace ``namespace`` (the API
    key's) split by the body's cache salt."""
    sampling = SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        # a ceiling, required by the API: clients send their own (Claude Code: 64,000),
        # so past the model's context it is the context (the prompt's room caps it further)
        max_tokens=min(body.max_tokens, card.context_length),
        stop=tuple(body.stop_sequences or ()),
    )
    thinking = body.thinking is not None and body.thinking.enabled
    request = GenerationRequest(
        messages=chat_messages(body),
        sampling=sampling,
        session=session_name(body.session, session_header),
        cache_namespace=with_salt(namespace, cache_salt(body)),
        priority=priority_of(body.priority, priority_header),
        speculative=speculative_of(body.radixchat),
        template_kwargs=thinking_kwargs(thinking),
        **tool_request(body, limits),
    )
    shown = body.thinking is None or body.thinking.display != "omitted"
    return MessagesCall(request, card.id, bool(body.stream), thinking, shown)


def count_request(
    body: CountTokensRequest, card: ModelCard, limits: RequestLimits = DEFAULT_REQUEST_LIMITS
) -> GenerationRequest:
    thinking = body.thinking is not None and body.thinking.enabled
    return GenerationRequest(
        messages=chat_messages(body),
        template_kwargs=thinking_kwargs(thinking),
        **tool_request(body, limits),
    )


# ------------------------------------------------------------------ replies
def model_object(card: ModelCard, name: str | None = None) -> dict[str, Any]:
    """The loaded model as Anthropic's ``/v1/models`` lists one (``name``: the name asked for)."""
    created = datetime.fromtimestamp(card.created, UTC).isoformat().replace("+00:00", "Z")
    return {
        "type": "model",
        "id": name or card.id,
        "display_name": f"{card.id} ({BASE_LABEL})" if card.base else card.id,
        "created_at": created,
        "lifecycle": "active",
        "max_input_tokens": card.context_length,
    }


def model_list(card: ModelCard) -> dict[str, Any]:
    names = [card.id, *card.listed]
    return {
        "data": [model_object(card, name) for name in names],
        "has_more": False,
        "first_id": names[0],
        "last_id": names[-1],
    }


def stop_reason(stats: RequestStats) -> str:
    if stats.finish_reason == "length":
        return "max_tokens"
    if stats.finish_reason == "tool_calls":
        return "tool_use"
    return "stop_sequence" if stats.stop_sequence is not None else "end_turn"


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
    }


def final_usage(stats: RequestStats) -> dict[str, Any]:
    return {
        **usage(
            stats.prompt_tokens,
            stats.cached_tokens + stats.restored_tokens,
            stats.completion_tokens,
        ),
        **usage_extra(stats),
    }


class MessageBuilder:
    """The message and stream events of one reply, all with the same id."""

    def __init__(self, call: MessagesCall):
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model = call.model
        self.call = call

    def full(
        self,
        text: str,
        stats: RequestStats,
        calls: tuple[ToolCall, ...] = (),
        reasoning: str = "",
    ) -> dict[str, Any]:
        content = []
        if self.call.thinking and reasoning:
            shown = reasoning if self.call.thinking_shown else ""
            content.append(
                {"type": "thinking", "thinking": shown, "signature": signature(reasoning)}
            )
        if text:  # as Anthropic: no empty text blocks
            content.append({"type": "text", "text": text})
        content += [self.tool_use(call) for call in calls]
        return {
            **self._message(content, stop_reason(stats), stats.stop_sequence),
            "usage": final_usage(stats),
        }

    def _message(self, content: list, reason: str | None, sequence: str | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
        }

    def start(self, prompt_tokens: int, cached_tokens: int) -> dict[str, Any]:
        return {
            "type": "message_start",
            "message": {
                **self._message([], None, None),
                "usage": usage(prompt_tokens, cached_tokens, 0),
            },
        }

    @staticmethod
    def tool_use(call: ToolCall, with_input: bool = True) -> dict[str, Any]:
        try:
            arguments = json.loads(call.arguments) if with_input else {}
        except ValueError:
            arguments = {}
        return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}

    @staticmethod
    def block_start(
        index: int = 0, call: ToolCall | None = None, thinking: bool = False
    ) -> dict[str, Any]:
        if call is not None:
            block = MessageBuilder.tool_use(call, with_input=False)
        elif thinking:
            block = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            block = {"type": "text", "text": ""}
        return {"type": "content_block_start", "index": index, "content_block": block}

    @staticmethod
    def thinking_delta(text: str, index: int) -> dict[str, Any]:
        return {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "thinking_delta", "thinking": text},
        }

    @staticmethod
    def signature_delta(thinking: str, index: int) -> dict[str, Any]:
        """A thinking block's last delta, before it stops: its signature."""
        return {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "signature_delta", "signature": signature(thinking)},
        }

    @staticmethod
    def input_delta(call: ToolCall, index: int) -> dict[str, Any]:
        return {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": call.arguments},
        }

    @staticmethod
    def text_delta(text: str, index: int = 0) -> dict[str, Any]:
        return {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "text_delta", "text": text},
        }

    @staticmethod
    def block_stop(index: int = 0) -> dict[str, Any]:
        return {"type": "content_block_stop", "index": index}

    @staticmethod
    def delta(stats: RequestStats) -> dict[str, Any]:
        return {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(stats), "stop_sequence": stats.stop_sequence},
            "usage": final_usage(stats),
        }


def signature(thinking: str) -> str:
    """A thinking block's ``signature``: opaque to clients, as Anthropic's is, and sent back
    with the block; here a digest of the thinking, never checked (the thinking sent back is
    what the template renders)."""
    return "radixchat-" + hashlib.sha256(thinking.encode("utf-8")).hexdigest()[:32]
