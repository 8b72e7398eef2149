"""Ollama's wire format: ``/api/chat``, ``/api/generate``, ``/api/show``, ``/api/pull`` and
``/api/delete`` bodies (pydantic models) in, and :func:`to_call`: a chat or generate body
turned into an :class:`OllamaCall`, a :class:`GenerationRequest` plus what the reply needs.

As :mod:`core.api.openai_schema`: FastAPI validates a body; :func:`to_call` checks what
needs the loaded model and raises :class:`ApiError` (a 400 naming the field) for what it
refuses. No HTTP and no engine here.

- ``options``: ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repeat_penalty``,
  ``seed``, ``num_predict`` and ``stop`` set the sampling; ``num_ctx`` bounds the reply;
  llama.cpp's knobs (``num_gpu``, ``num_thread``, ``mirostat``...) are accepted and have
  nothing to set here. Unset, the sampling is Ollama's: temperature 0.8, top_k 40,
  top_p 0.9.
- ``format``: ``"json"`` or a JSON schema, held by the same grammar as the other dialects.
- ``tools`` (OpenAI's shape) and ``tool_calls`` with arguments as objects; a ``tool``
  message answers the call named by its ``tool_call_id`` or ``tool_name``, else the oldest
  one unanswered. Ollama has no ``tool_choice``: RadixChat takes OpenAI's values in the body
  or the ``X-RadixChat-Tool-Choice`` header (``required`` or a tool's name force a call).
- ``think``: the template's thinking switch (``enable_thinking``; a level is gpt-oss's
  ``reasoning_effort`` too); the engine takes a reasoning model's thinking out of the reply,
  sent as ``thinking`` unless ``think`` is false. Refused on a model that does not reason.
  ``images``: refused (RadixChat serves text models).
- ``/api/generate``: ``system``, ``template`` (:mod:`core.api.ollama_template`), ``raw``,
  ``context`` (token ids of an earlier prompt and reply, read before this prompt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from core.api.errors import ApiError, invalid
from core.api.limits import DEFAULT_REQUEST_LIMITS, RequestLimits
from core.api.ollama_template import TemplateError, render
from core.api.openai_schema import (
    MAX_STOPS,
    MAX_TOP_K,
    header_text,
    priority_of,
    session_name,
    speculative_of,
    unsupported,
)
from core.api.openai_tools import (
    ChosenFunction,
    JsonSchemaFormat,
    NamedToolChoice,
    ResponseFormat,
    ToolChoice,
    ToolDef,
    tool_fields,
)
from core.api.reasoning import effort_kwargs, thinking_kwargs
from core.api.wire import (
    CACHE_SALT_TEXT,
    MAX_PRIORITY,
    MAX_SALT_CHARS,
    MAX_SESSION_CHARS,
    ModelCard,
    RadixChatOptions,
    Text,
    WireModel,
)
from core.engine.namespaces import with_salt
from core.engine.template_facts import TemplateFacts
from core.engine.types import ChatMessage, GenerationRequest, SamplingParams, ToolCall

# Ollama's sampling where a request and the model say nothing (its runner's defaults)
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.9
FILL_CONTEXT = -2  # num_predict: up to the end of the context
TokenId = Annotated[int, Field(ge=0)]
Duration = int | float | Text  # keep_alive: seconds, or Go's "5m", "1h30m"; -1 forever


# ------------------------------------------------------------------ request bodies
class OllamaOptions(WireModel):
    """``options``: the sampling RadixChat applies; llama.cpp's other knobs are accepted."""

    temperature: float | None = Field(None, ge=0, description="0 is greedy (default 0.8)")
    top_p: float | None = Field(None, gt=0, le=1, description="default 0.9")
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K, description="0: off (default 40)")
    min_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, gt=0, le=10, description="default 1 (off)")
    seed: int | None = Field(None, lt=2**64, description="a negative seed: a random one")
    num_predict: int | None = Field(
        None,
        ge=FILL_CONTEXT,
        description="reply tokens; -1 (default): the server's --max-output-tokens; "
        "-2: up to the end of the context",
    )
    num_ctx: int | None = Field(
        None, ge=1, description="bounds the reply (the model's context stays whole)"
    )
    stop: Text | list[Text] | None = Field(None, description=f"at most {MAX_STOPS} strings")


class CalledFunction(WireModel):
    name: Text
    arguments: dict[str, Any] | Text = Field(
        default_factory=dict, description="an object (or its JSON text)"
    )


class OllamaToolCall(WireModel):
    """A call an earlier assistant message made (Ollama's: no id needed)."""

    function: CalledFunction
    id: Text | None = None
    index: int | None = None


class OllamaMessage(WireModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: Text | None = None
    images: list[Text] | None = Field(None, description="refused: RadixChat serves text models")
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: Text | None = Field(None, description="the tool a tool message answers")
    tool_call_id: Text | None = Field(None, description="the call a tool message answers")
    thinking: Text | None = Field(
        None, description="an earlier reply's thinking: to the template, which may render it"
    )


class _Generation(WireModel):
    """What ``/api/chat`` and ``/api/generate`` share (and RadixChat's own fields)."""

    model: Text | None = None
    format: Literal["", "json"] | dict[str, Any] | None = Field(
        None, description='"json" or a JSON schema: constrained decoding'
    )
    options: OllamaOptions | None = None
    stream: bool | None = Field(None, description="NDJSON (default) or one object (false)")
    keep_alive: Duration | None = Field(
        None, description="accepted: the model stays loaded while the server runs"
    )
    think: bool | Literal["high", "medium", "low"] | None = Field(
        None, description="a reasoning model's thought apart from its answer"
    )
    logprobs: bool | None = None
    top_logprobs: int | None = None
    session: Text | None = Field(
        None,
        max_length=MAX_SESSION_CHARS,
        description="RadixChat: the chat session whose cache this request extends",
    )
    cache_salt: Text | None = Field(
        None, min_length=1, max_length=MAX_SALT_CHARS, description="RadixChat: " + CACHE_SALT_TEXT
    )
    priority: int | None = Field(
        None, ge=0, le=MAX_PRIORITY, description="RadixChat: lower is prefilled sooner"
    )
    radixchat: RadixChatOptions | None = None

    _no_logprobs = unsupported("logprobs", "top_logprobs", message="logprobs are not supported")


class OllamaChatRequest(_Generation):
    """``POST /api/chat``."""

    messages: list[OllamaMessage] = Field(default_factory=list, description="none: load only")
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = Field(
        None,
        description="RadixChat: OpenAI's auto (default), none, required or a named function "
        "(or the X-RadixChat-Tool-Choice header: auto, none, required or a tool's name)",
    )


class OllamaGenerateRequest(_Generation):
    """``POST /api/generate``."""

    prompt: Text = Field("", description="empty: load only")
    suffix: Text | None = None
    system: Text | None = None
    template: Text | None = Field(None, description="a Go template of .System and .Prompt")
    context: list[TokenId] | None = Field(None, description="an earlier reply's context")
    raw: bool | None = Field(None, description="the prompt as it is, no template")
    images: list[Text] | None = None


class OllamaModelRequest(WireModel):
    """``/api/show`` and ``/api/delete``: a model by name (``model``, or ``name`` as older
    clients send it)."""

    model: Text | None = None
    name: Text | None = None
    verbose: bool | None = None

    def model_name(self) -> str:
        name = (self.model or self.name or "").strip()
        if not name:
            raise invalid("model", "model is required", code="missing_required_parameter")
        return name


class OllamaPullRequest(OllamaModelRequest):
    """``POST /api/pull``."""

    insecure: bool | None = None
    stream: bool | None = None


# ------------------------------------------------------------------ checks that need the model
@dataclass(frozen=True)
class OllamaCall:
    """A checked ``/api/chat`` (``chat``) or ``/api/generate`` request. ``loading``: an empty
    one only loads or unloads the model ("load" / "unload", no request runs)."""

    chat: bool
    request: GenerationRequest | None
    stream: bool
    thinking: bool = True  # a reasoning model's thinking is sent (not with think: false)
    context: bool = False  # the reply carries ``context`` (generate, not raw)
    loading: str | None = None


def model_of(body: WireModel) -> str:
    name = (body.model or "").strip()
    if not name:
        raise invalid("model", "model is required", code="missing_required_parameter")
    return name


def unloads(keep_alive: Duration | None) -> bool:
    """``keep_alive`` 0 (or "0", "0s"): the client asks for the model to be unloaded."""
    if isinstance(keep_alive, (int, float)):
        return keep_alive == 0
    return isinstance(keep_alive, str) and keep_alive.strip() in ("0", "0s", "0m", "0h")


def sampling(
    options: OllamaOptions | None, context_length: int, limits: RequestLimits
) -> SamplingParams:
    """``options`` as the engine samples (Ollama's defaults where unset)."""
    o = options or OllamaOptions()
    if o.num_predict is None or o.num_predict == -1:
        limit = limits.default_reply_tokens(context_length)
    elif o.num_predict == FILL_CONTEXT:
        limit = context_length
    elif o.num_predict == 0:
        raise invalid(
            "options.num_predict",
            "'options.num_predict' must be a number of tokens, -1 or -2",
        )
    else:
        limit = min(o.num_predict, context_length)  # a ceiling, as Ollama's
    if o.num_ctx is not None:
        limit = min(limit, o.num_ctx)
    stop = [o.stop] if isinstance(o.stop, str) else o.stop or []
    if len(stop) > MAX_STOPS:
        raise invalid("options.stop", f"at most {MAX_STOPS} stop strings")
    return SamplingParams(
        temperature=DEFAULT_TEMPERATURE if o.temperature is None else o.temperature,
        top_p=DEFAULT_TOP_P if o.top_p is None else o.top_p,
        top_k=DEFAULT_TOP_K if o.top_k is None else o.top_k,
        min_p=o.min_p or 0.0,
        repetition_penalty=1.0 if o.repeat_penalty is None else o.repeat_penalty,
        seed=o.seed if o.seed is not None and o.seed >= 0 else None,
        max_tokens=limit,
        stop=tuple(s for s in stop if s),
    )


def think_kwargs(think, facts: TemplateFacts | None, model: str) -> dict[str, Any]:
    """The template variables ``think`` sets; a 400 for ``think`` on a model that does not
    reason (``think: false`` is taken anywhere: there is nothing to switch off)."""
    if think is None:
        return {}
    if think is not False and (facts is None or not facts.reasons):
        raise invalid("think", f'"{model}" does not support thinking')
    kwargs = thinking_kwargs(think is not False)
    return {**kwargs, **effort_kwargs(think)} if isinstance(think, str) else kwargs


def _no_images(images: list[str] | None, param: str, model: str) -> None:
    if images:
        raise invalid(
            param,
            f'"{model}" cannot read images: RadixChat serves text models (send text only)',
        )


TOOL_CHOICE_HEADER = "X-RadixChat-Tool-Choice"


def tool_choice_of(body: OllamaChatRequest, header: str | None) -> ToolChoice | None:
    """The body's ``tool_choice``, else the header's when the request has tools (a client
    sends its headers with every request; a value other than auto, none and required names
    a tool)."""
    if body.tool_choice is not None:
        return body.tool_choice
    if not body.tools:
        return None
    text = header_text(TOOL_CHOICE_HEADER, header)
    if text is None or not text.strip():
        return None
    text = text.strip()
    if text in ("auto", "none", "required"):
        return text
    return NamedToolChoice(type="function", function=ChosenFunction(name=text))


def _format_fields(
    body: _Generation, tools, limits: RequestLimits, tool_choice: ToolChoice | None = None
) -> dict[str, Any]:
    """The request's tools and ``format`` through the same checks as OpenAI's bodies."""
    response_format = None
    if body.format == "json":
        response_format = ResponseFormat(type="json_object")
    elif isinstance(body.format, dict):
        response_format = ResponseFormat(
            type="json_schema", json_schema=JsonSchemaFormat(name="format", schema=body.format)
        )
    return tool_fields(tools, tool_choice, response_format, limits, schema_param="format")


def chat_messages(messages: list[OllamaMessage], model: str) -> tuple[ChatMessage, ...]:
    """The engine's messages. A call without an id gets one from its place (the same every
    time the conversation is sent, so the prompt, and its cache, stay the same)."""
    out: list[ChatMessage] = []
    pending: list[ToolCall] = []  # calls not answered yet, oldest first
    for i, message in enumerate(messages):
        _no_images(message.images, f"messages[{i}].images", model)
        text = message.content or ""
        if message.role == "assistant":
            calls = tuple(
                ToolCall(
                    call.id or f"call_{i}_{j}",
                    call.function.name,
                    call.function.arguments
                    if isinstance(call.function.arguments, str)
                    else json.dumps(call.function.arguments, ensure_ascii=False),
                )
                for j, call in enumerate(message.tool_calls or ())
            )
            pending = list(calls) or pending
            out.append(ChatMessage("assistant", text, calls, reasoning=message.thinking or ""))
        elif message.role == "tool":
            answered = _answered(pending, message)
            if answered is not None:
                pending.remove(answered)
            name = message.tool_name or (answered.name if answered else None)
            call_id = answered.id if answered else message.tool_call_id
            out.append(ChatMessage("tool", text, tool_call_id=call_id, name=name))
        else:
            out.append(ChatMessage(message.role, text))
    return tuple(out)


def _answered(pending: list[ToolCall], message: OllamaMessage) -> ToolCall | None:
    """The call a tool message answers: by id, else by tool name, else the oldest pending."""
    for call in pending:
        if message.tool_call_id and call.id == message.tool_call_id:
            return call
    for call in pending:
        if message.tool_name and call.name == message.tool_name:
            return call
    return pending[0] if pending and not message.tool_name else None


def generate_prompt(body: OllamaGenerateRequest, model: str) -> dict[str, Any]:
    """The GenerationRequest fields of a generate body's prompt."""
    _no_images(body.images, "images", model)
    if body.suffix:
        raise invalid("suffix", f'"{model}" does not support insert (fill-in-the-middle)')
    if body.raw:
        return {"prompt_text": body.prompt}
    if body.template:
        try:
            return {"prompt_text": render(body.template, body.system or "", body.prompt)}
        except TemplateError as exc:
            raise invalid("template", str(exc)) from None
    system = [ChatMessage("system", body.system)] if body.system else []
    return {"messages": (*system, ChatMessage("user", body.prompt))}


def to_call(
    body: OllamaChatRequest | OllamaGenerateRequest,
    card: ModelCard,
    facts: TemplateFacts | None,
    session_header: str | None = None,
    namespace: str = "",
    priority_header: str | None = None,
    tool_choice_header: str | None = None,
    limits: RequestLimits = DEFAULT_REQUEST_LIMITS,
) -> OllamaCall:
    """The engine request for a validated body (any model name is served by the loaded
    model), in cache namespace ``namespace`` split by the body's ``cache_salt``; raise
    :class:`ApiError` for what cannot be served."""
    chat = isinstance(body, OllamaChatRequest)
    model = model_of(body)
    stream = body.stream is not False
    empty = not body.messages if chat else not body.prompt and not body.context
    if empty:
        return OllamaCall(
            chat, None, stream, loading="unload" if unloads(body.keep_alive) else "load"
        )
    switches = think_kwargs(body.think, facts, model)
    if chat:
        extra = _format_fields(body, body.tools, limits, tool_choice_of(body, tool_choice_header))
    else:
        extra = _format_fields(body, None, limits)
    if chat:
        prompt: dict[str, Any] = {"messages": chat_messages(body.messages, model)}
    else:
        prompt = generate_prompt(body, model)
        if body.context:
            prompt["context_tokens"] = tuple(body.context)
    request = GenerationRequest(
        sampling=sampling(body.options, card.context_length, limits),
        session=session_name(body.session, session_header),
        cache_namespace=with_salt(namespace, body.cache_salt),
        priority=priority_of(body.priority, priority_header),
        speculative=speculative_of(body.radixchat),
        template_kwargs=switches,
        **prompt,
        **extra,
    )
    return OllamaCall(chat, request, stream, body.think is not False, not chat and not body.raw)


__all__ = [
    "ApiError",
    "OllamaCall",
    "OllamaChatRequest",
    "OllamaGenerateRequest",
    "OllamaModelRequest",
    "OllamaPullRequest",
    "to_call",
]
