"""The OpenAI Responses wire format: ``POST /v1/responses`` bodies (pydantic models) in, a
:class:`ResponsesCall` out.

FastAPI validates a body against :class:`ResponsesRequest`; :func:`to_call` turns it, with
the conversation of its ``previous_response_id`` (read from the store by the route), into
a :class:`GenerationRequest` plus what the reply needs. Like :mod:`core.api.openai_schema`:
no HTTP and no engine here.

What reaches the model (see docs/api.md, "Responses API"):

- ``instructions`` and the leading ``system``/``developer`` messages: one system message;
- ``message`` items (text parts; ``input_text``, ``output_text``, ``refusal``), messages of
  one role in a row joined into one (templates that want roles to alternate take them);
- ``function_call`` items: the assistant's tool calls; ``function_call_output``: the tool
  turns answering them (by ``call_id``); ``custom_tool_call`` and its output likewise;
- ``reasoning`` items: their text is the thinking of the assistant turn after them (a
  template that keeps earlier thinking, as Qwen3's does within a tool loop, renders it).

Tools: ``function`` tools as they are; ``custom`` (free-form) tools as a function taking one
string, ``input``, whose calls come back as ``custom_tool_call`` items; the function and
custom tools of a ``namespace`` tool likewise, their calls naming the namespace; every other
kind (hosted tools such as ``web_search``, ``file_search``, ``mcp``, ``local_shell``,
``computer_use``, ``image_generation``) is accepted and dropped: the server runs none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Discriminator, Field, Tag, TypeAdapter

from core.api.errors import ApiError, invalid
from core.api.limits import DEFAULT_REQUEST_LIMITS, RequestLimits
from core.api.openai_schema import (
    SamplingFields,
    max_tokens,
    priority_of,
    sampling_params,
    session_name,
    speculative_of,
    unsupported,
)
from core.api.openai_tools import (
    ChosenFunction,
    FunctionDef,
    JsonSchemaFormat,
    NamedToolChoice,
    ResponseFormat,
    ToolDef,
    tool_fields,
)
from core.api.reasoning import effort_kwargs
from core.api.wire import ModelCard, Text, WireModel
from core.engine.namespaces import with_salt
from core.engine.types import ChatMessage, GenerationRequest, ToolCall

TURN_JOIN = "\n\n"  # the texts of messages of one role in a row, made one message
CUSTOM_INPUT = "input"  # the one argument of a custom tool, as the model calls it
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _tagged(tags: dict[str, str], default: str | None = None):
    """A discriminator over ``type`` (``default`` where a value has no type)."""

    def tag(value: Any) -> str | None:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        if kind is None:
            return default
        return tags.get(kind, tags.get("*")) if isinstance(kind, str) else None

    return tag


# ------------------------------------------------------------------ input items
class TextPart(WireModel):
    type: Literal["input_text", "output_text", "text"]
    text: Text


class RefusalPart(WireModel):
    type: Literal["refusal"]
    refusal: Text


_PART_TAGS = {"input_text": "TextPart", "output_text": "TextPart", "text": "TextPart"}
ContentPart = Annotated[
    Annotated[TextPart, Tag("TextPart")] | Annotated[RefusalPart, Tag("RefusalPart")],
    Discriminator(
        _tagged({**_PART_TAGS, "refusal": "RefusalPart"}),
        custom_error_type="invalid_part",
        custom_error_message="a content part's type is input_text, output_text or refusal "
        "(this server reads text only: no images, files or audio)",
    ),
]


def _part_text(part: TextPart | RefusalPart) -> str:
    return part.text if isinstance(part, TextPart) else part.refusal


def content_text(content: str | list | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(_part_text(part) for part in content)


class MessageItem(WireModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | list[ContentPart]
    id: Text | None = None
    status: Text | None = None


class FunctionCallItem(WireModel):
    type: Literal["function_call"]
    call_id: Text
    name: Text
    arguments: Text = Field(description="the arguments as JSON text")
    namespace: Text | None = None
    id: Text | None = None
    status: Text | None = None


class CustomToolCallItem(WireModel):
    type: Literal["custom_tool_call"]
    call_id: Text
    name: Text
    input: Text
    namespace: Text | None = None
    id: Text | None = None


class CallOutputItem(WireModel):
    """``function_call_output`` or ``custom_tool_call_output``: a tool's result."""

    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: Text
    output: Text | list[ContentPart]
    id: Text | None = None
    status: Text | None = None


class ReasoningPart(WireModel):
    """A reasoning item's text: its ``content`` (``reasoning_text``) or ``summary``
    (``summary_text``) parts."""

    type: Text
    text: Text = ""


class ReasoningItem(WireModel):
    """A reasoning item of an earlier reply, sent back: its text (its ``content``, else its
    ``summary``) is the thinking of the assistant turn that follows it; an item with
    neither (``encrypted_content`` only, another server's) adds nothing."""

    type: Literal["reasoning"]
    id: Text | None = None
    content: list[ReasoningPart] | None = None
    summary: list[ReasoningPart] | None = None

    def text(self) -> str:
        parts = self.content or self.summary or []
        return TURN_JOIN.join(part.text for part in parts if part.text)


_ITEM_TAGS = {
    "message": "MessageItem",
    "function_call": "FunctionCallItem",
    "custom_tool_call": "CustomToolCallItem",
    "function_call_output": "CallOutputItem",
    "custom_tool_call_output": "CallOutputItem",
    "reasoning": "ReasoningItem",
}
InputItem = Annotated[
    Annotated[MessageItem, Tag("MessageItem")]
    | Annotated[FunctionCallItem, Tag("FunctionCallItem")]
    | Annotated[CustomToolCallItem, Tag("CustomToolCallItem")]
    | Annotated[CallOutputItem, Tag("CallOutputItem")]
    | Annotated[ReasoningItem, Tag("ReasoningItem")],
    Discriminator(
        _tagged(_ITEM_TAGS, default="MessageItem"),
        custom_error_type="invalid_item",
        custom_error_message=f"an input item's type is one of {', '.join(_ITEM_TAGS)}",
    ),
]


STORED_ITEMS = TypeAdapter(list[InputItem])  # a stored conversation, read back


# ------------------------------------------------------------------ metadata
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's limits


def _metadata_limits(value: dict[str, str]) -> dict[str, str]:
    if len(value) > METADATA_PAIRS:
        raise ValueError(f"at most {METADATA_PAIRS} key-value pairs ({len(value)} given)")
    for key, text in value.items():
        if len(key) > METADATA_KEY_CHARS:
            raise ValueError(f"a key is at most {METADATA_KEY_CHARS} characters ({len(key)})")
        if len(text) > METADATA_VALUE_CHARS:
            raise ValueError(
                f"the value of {key!r} is {len(text):,} characters; at most "
                f"{METADATA_VALUE_CHARS} (as OpenAI's)"
            )
    return value


# a response's or a conversation's ``metadata``: stored, never read by the model
Metadata = Annotated[dict[Text, Text], AfterValidator(_metadata_limits)]
MAX_USER_CHARS = 256  # ``user``: stored with the response, never read by the model


# ------------------------------------------------------------------ tools
class FunctionTool(WireModel):
    type: Literal["function"]
    name: Text = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON Schema for the arguments")
    strict: bool | None = None


class CustomTool(WireModel):
    """A free-form tool: the model writes its input as text (its ``format``, a grammar, is
    not enforced)."""

    type: Literal["custom"]
    name: Text = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: Text | None = None


class OtherTool(WireModel):
    """A tool kind the server does not run (hosted tools): accepted and dropped."""

    type: Text


_TOOL_TAGS = {"function": "FunctionTool", "custom": "CustomTool", "*": "OtherTool"}
NamespacedTool = Annotated[
    Annotated[FunctionTool, Tag("FunctionTool")]
    | Annotated[CustomTool, Tag("CustomTool")]
    | Annotated[OtherTool, Tag("OtherTool")],
    Discriminator(_tagged(_TOOL_TAGS)),
]


class NamespaceTool(WireModel):
    type: Literal["namespace"]
    name: Text
    description: Text | None = None
    tools: list[NamespacedTool] = Field(default_factory=list)


Tool = Annotated[
    Annotated[FunctionTool, Tag("FunctionTool")]
    | Annotated[CustomTool, Tag("CustomTool")]
    | Annotated[NamespaceTool, Tag("NamespaceTool")]
    | Annotated[OtherTool, Tag("OtherTool")],
    Discriminator(_tagged({**_TOOL_TAGS, "namespace": "NamespaceTool"})),
]


class NamedTool(WireModel):
    type: Literal["function", "custom"]
    name: Text


class AllowedTools(WireModel):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[NamedTool]


class HostedToolChoice(WireModel):
    type: Text


ToolChoice = Literal["auto", "none", "required"] | NamedTool | AllowedTools | HostedToolChoice


# ------------------------------------------------------------------ text format
class TextFormat(WireModel):
    type: Literal["text", "json_object", "json_schema"]
    name: Text | None = Field(None, min_length=1, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: Text | None = None
    strict: bool | None = None


class TextConfig(WireModel):
    format: TextFormat | None = None
    verbosity: Text | None = None


class ReasoningConfig(WireModel):
    """``reasoning``: its ``effort`` reaches the template (``core.api.reasoning``); a
    reasoning model's thinking comes back as a ``reasoning`` output item whatever the
    ``summary`` asks (the model writes no summary: its thinking is the item's content)."""

    effort: Text | None = None
    summary: Text | None = None
    generate_summary: Text | None = None


class ConversationRef(WireModel):
    id: Text


class ResponsesRequest(SamplingFields):
    """``POST /v1/responses``."""

    input: Text | list[InputItem] = Field(default_factory=list)
    instructions: Text | None = None
    tools: list[Tool] | None = Field(
        None, description="function and custom tools (others are accepted and dropped)"
    )
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = Field(None, description="format: json_object or json_schema")
    max_output_tokens: int | None = Field(None, ge=1)
    previous_response_id: Text | None = None
    store: bool | None = Field(None, description="keep the response (default true)")
    metadata: Metadata | None = None
    user: Text | None = Field(None, max_length=MAX_USER_CHARS)
    reasoning: ReasoningConfig | None = Field(
        None, description="effort: to the chat template as reasoning_effort (none: thinking off)"
    )
    include: list[Text] | None = Field(None, description="accepted and ignored")
    prompt_cache_key: Text | None = Field(
        None, description="accepted and ignored: every prefix is cached (see cache_salt)"
    )
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    conversation: Text | ConversationRef | None = Field(
        None, description="a stored conversation (its id): its items, then the input"
    )
    top_logprobs: int | None = None

    _no_background = unsupported("background", message="background responses are not supported")

    @property
    def conversation_id(self) -> str | None:
        conversation = self.conversation
        return conversation.id if isinstance(conversation, ConversationRef) else conversation

    _no_logprobs = unsupported("top_logprobs", message="logprobs are not supported")


# ------------------------------------------------------------------ checks that need the model
@dataclass(frozen=True)
class ServedTools:
    """The tools the model is given (the engine's OpenAI shape), and how to answer its calls:
    which are custom tools (answered as ``custom_tool_call``) and which namespace each is in."""

    tools: tuple[ToolDef, ...] = ()
    custom: frozenset[str] = frozenset()
    namespaces: dict[str, str] = field(default_factory=dict)
    where: dict[str, int] = field(default_factory=dict)  # name -> index in the body's tools


@dataclass(frozen=True)
class ResponsesCall:
    """A checked ``/v1/responses`` request."""

    request: GenerationRequest
    stream: bool
    store: bool
    tools: ServedTools
    # this request's own input items, as stored (after the ones it continues)
    input: tuple[dict[str, Any], ...]
    body: ResponsesRequest


def _function(tool: FunctionTool | CustomTool) -> ToolDef:
    if isinstance(tool, FunctionTool):
        return ToolDef(
            type="function",
            function=FunctionDef(
                name=tool.name,
                description=tool.description,
                parameters=tool.parameters,
                strict=tool.strict,
            ),
        )
    return ToolDef(
        type="function",
        function=FunctionDef(
            name=tool.name,
            description=tool.description,
            parameters={
                "type": "object",
                "properties": {CUSTOM_INPUT: {"type": "string", "description": "free text"}},
                "required": [CUSTOM_INPUT],
            },
        ),
    )


def served_tools(tools: list | None) -> ServedTools:
    """The function and custom tools of ``tools`` (a namespace's flattened), each name once."""
    served: dict[str, ToolDef] = {}
    custom, spaces, where = set(), {}, {}
    for i, tool in enumerate(tools or ()):
        inner = tool.tools if isinstance(tool, NamespaceTool) else [tool]
        for one in inner:
            if not isinstance(one, (FunctionTool, CustomTool)) or one.name in served:
                continue
            served[one.name] = _function(one)
            where[one.name] = i
            if isinstance(one, CustomTool):
                custom.add(one.name)
            if isinstance(tool, NamespaceTool):
                spaces[one.name] = tool.name
    return ServedTools(tuple(served.values()), frozenset(custom), spaces, where)


def _choice(body: ResponsesRequest, served: ServedTools):
    """The chat API's tool choice for the body's, and the tools it leaves (allowed_tools)."""
    choice, tools = body.tool_choice, served.tools
    if isinstance(choice, NamedTool):
        if choice.name not in {t.function.name for t in tools}:
            raise invalid(
                "tool_choice.name",
                f"tool_choice names {choice.name!r}, which is not among the tools",
            )
        return NamedToolChoice(type="function", function=ChosenFunction(name=choice.name)), tools
    if isinstance(choice, AllowedTools):
        names = {t.name for t in choice.tools}
        return choice.mode, tuple(t for t in tools if t.function.name in names)
    if isinstance(choice, HostedToolChoice):
        raise invalid(
            "tool_choice.type",
            f"tool_choice {choice.type!r} names a hosted tool, which this server does not run",
            code="unsupported_value",
        )
    return choice, tools


def _format(text: TextConfig | None) -> ResponseFormat | None:
    form = text.format if text is not None else None
    if form is None or form.type != "json_schema":
        return ResponseFormat(type=form.type) if form is not None else None
    if form.schema_ is None:
        raise invalid(
            "text.format.schema",
            "'text.format.schema' is required when 'text.format.type' is 'json_schema'",
            code="missing_required_parameter",
        )
    return ResponseFormat(
        type="json_schema",
        json_schema=JsonSchemaFormat(name=form.name or "schema", schema=form.schema_),
    )


def _tool_fields(body: ResponsesRequest, served: ServedTools, limits: RequestLimits) -> dict:
    choice, tools = _choice(body, served)
    try:
        return tool_fields(
            list(tools) or None,
            choice,
            _format(body.text),
            limits,
            schema_param="text.format.schema",
        )
    except ApiError as exc:
        raise _in_body(exc, tools, served) from None


def _in_body(error: ApiError, tools: tuple[ToolDef, ...], served: ServedTools) -> ApiError:
    """``error`` naming the body's field: a served tool's ``tools[i].function.x`` is the
    body's ``tools[j].x`` (the body's list has other kinds, and namespaces, in it)."""
    param = error.param or ""
    if not param.startswith("tools[") or not tools:
        return error
    end = param.index("]")
    name = tools[int(param[len("tools[") : end])].function.name
    renamed = f"tools[{served.where[name]}]" + param[end + 1 :].replace(".function", "", 1)
    return ApiError(
        error.status, error.message.replace(param, renamed), param=renamed, code=error.code
    )


def item_dicts(items: list) -> list[dict[str, Any]]:
    """Validated input items as the store keeps them (what a continuation reads back)."""
    return [item.model_dump(by_alias=True, exclude_none=True) for item in items]


def _call_text(item: FunctionCallItem | CustomToolCallItem) -> str:
    if isinstance(item, FunctionCallItem):
        return item.arguments
    return json.dumps({CUSTOM_INPUT: item.input}, ensure_ascii=False)


def chat_messages(instructions: str | None, items: list) -> tuple[ChatMessage, ...]:
    """The engine's messages for ``instructions`` and the conversation's ``items``."""
    out: list[ChatMessage] = []
    if instructions:
        out.append(ChatMessage("system", instructions))
    calls: dict[str, str] = {}  # every call so far: call_id -> tool name
    thought = ""  # reasoning items' text, for the assistant turn that follows them
    for i, item in enumerate(items):
        if isinstance(item, ReasoningItem):
            thought = TURN_JOIN.join(t for t in (thought, item.text()) if t)
            continue
        if isinstance(item, MessageItem):
            role = ROLES[item.role]
            if role == "system" and any(m.role != "system" for m in out):
                out.append(ChatMessage("system", content_text(item.content)))
            else:
                mine = thought if role == "assistant" else ""
                _add(out, ChatMessage(role, content_text(item.content), reasoning=mine))
                thought = ""
        elif isinstance(item, (FunctionCallItem, CustomToolCallItem)):
            call = ToolCall(item.call_id, item.name, _call_text(item))
            calls[call.id] = call.name
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                mine = TURN_JOIN.join(t for t in (last.reasoning, thought) if t)
                out[-1] = ChatMessage(
                    "assistant", last.content, (*last.tool_calls, call), reasoning=mine
                )
            else:
                out.append(ChatMessage("assistant", "", (call,), reasoning=thought))
            thought = ""
        else:
            if item.call_id not in calls:
                raise invalid(
                    f"input[{i}].call_id",
                    f"'input[{i}].call_id' ({item.call_id}) answers no function_call "
                    "item before it",
                )
            out.append(
                ChatMessage(
                    "tool",
                    content_text(item.output),
                    tool_call_id=item.call_id,
                    name=calls[item.call_id],
                )
            )
    if not any(m.role != "system" for m in out):
        raise invalid("input", "'input' must hold a message (or continue a previous response)")
    return tuple(out)


def _add(out: list[ChatMessage], message: ChatMessage) -> None:
    """Append ``message``, joined to the last one where it is of the same role (text only)."""
    last = out[-1] if out else None
    if last is not None and last.role == message.role and not last.tool_calls:
        out[-1] = ChatMessage(
            message.role,
            TURN_JOIN.join(t for t in (last.content, message.content) if t),
            reasoning=TURN_JOIN.join(t for t in (last.reasoning, message.reasoning) if t),
        )
    else:
        out.append(message)


def to_call(
    body: ResponsesRequest,
    card: ModelCard,
    session_header: str | None = None,
    namespace: str = "",
    priority_header: str | None = None,
    history: tuple[dict[str, Any], ...] = (),
    limits: RequestLimits = DEFAULT_REQUEST_LIMITS,
) -> ResponsesCall:
    """The engine request for a validated body continuing ``history`` (the items of its
    previous response's chain, or of its conversation, from the store), in cache namespace
    ``namespace``."""
    # any model name is served by the loaded model (the reply names it)
    own = (
        [MessageItem(role="user", content=body.input)]
        if isinstance(body.input, str)
        else body.input
    )
    items = [*(STORED_ITEMS.validate_python(list(history)) if history else []), *own]
    served = served_tools(body.tools)
    limit = max_tokens(body.max_output_tokens, "max_output_tokens", card.context_length, limits)
    request = GenerationRequest(
        messages=chat_messages(body.instructions, items),
        sampling=sampling_params(body, limit),
        session=session_name(body.session, session_header),
        cache_namespace=with_salt(namespace, body.cache_salt),
        priority=priority_of(body.priority, priority_header),
        speculative=speculative_of(body.radixchat),
        template_kwargs=effort_kwargs(body.reasoning.effort if body.reasoning else None),
        **_tool_fields(body, served, limits),
    )
    store = body.store is not False
    return ResponsesCall(request, bool(body.stream), store, served, tuple(item_dicts(own)), body)
