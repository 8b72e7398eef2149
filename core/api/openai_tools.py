"""OpenAI's tools and structured output on the wire: ``tools``, ``tool_choice``,
``response_format``, assistant ``tool_calls`` and ``role: "tool"`` messages in, ``tool_calls``
(and ``delta.tool_calls``) out.

The bodies are pydantic models (part of :class:`core.api.openai_schema.ChatCompletionRequest`);
:func:`tool_fields` checks what pydantic cannot (a tool schema that is not valid JSON
Schema, a feature the grammar library cannot enforce, a ``tool_choice`` naming no tool)
and raises a 400 naming the field. No HTTP and no engine here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from core.api.errors import invalid
from core.api.limits import DEFAULT_REQUEST_LIMITS, RequestLimits
from core.api.wire import Text, WireModel
from core.engine.constrain import SchemaError, check_schema, check_tools
from core.engine.types import ToolCall

JSON_OBJECT = {"type": "object"}


class FunctionDef(WireModel):
    name: Text = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON Schema for the arguments")
    strict: bool | None = None


class ToolDef(WireModel):
    type: Literal["function"]
    function: FunctionDef


class ChosenFunction(WireModel):
    name: Text


class NamedToolChoice(WireModel):
    """``{"type": "function", "function": {"name": ...}}``: this function must be called."""

    type: Literal["function"]
    function: ChosenFunction


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class CalledFunction(WireModel):
    name: Text
    arguments: Text = Field(description="the arguments as JSON text")


class ToolCallIn(WireModel):
    """A call an earlier assistant message made."""

    id: Text
    type: Literal["function"] = "function"
    function: CalledFunction


class JsonSchemaFormat(WireModel):
    name: Text = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: Text | None = None
    strict: bool | None = None


class ResponseFormat(WireModel):
    """``{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


def tool_fields(
    tools: list[ToolDef] | None,
    tool_choice: ToolChoice | None,
    response_format: ResponseFormat | None,
    limits: RequestLimits = DEFAULT_REQUEST_LIMITS,
    schema_param: str = "response_format.json_schema.schema",
) -> dict[str, Any]:
    """The ``GenerationRequest`` fields for a body's tools and response format; a 400
    naming the field for what cannot be served (tools past the ``limits`` too).
    ``schema_param``: where the body carries the response format's schema."""
    fields: dict[str, Any] = {}
    limits.check_body({"tools": tools or []})
    if tools:
        fields["tools"] = tuple(t.model_dump(exclude_none=True) for t in tools)
    schema_format = response_format.json_schema if response_format is not None else None
    limits.check_schemas(
        [
            *fields.get("tools", ()),
            *(
                [schema_format.schema_]
                if schema_format is not None and schema_format.schema_
                else []
            ),
        ]
    )
    if isinstance(tool_choice, NamedToolChoice):
        fields["tool_choice"], fields["tool_name"] = "function", tool_choice.function.name
    elif tool_choice is not None:
        fields["tool_choice"] = tool_choice
    try:
        if tools or fields.get("tool_choice") in ("required", "function"):
            check_tools(
                fields.get("tools", ()), fields.get("tool_choice", "auto"), fields.get("tool_name")
            )
        if response_format is not None and response_format.type == "json_object":
            fields["json_schema"] = JSON_OBJECT
        elif response_format is not None and response_format.type == "json_schema":
            if response_format.json_schema is None:
                raise invalid(
                    "response_format.json_schema",
                    "'response_format.json_schema' is required "
                    "when 'response_format.type' is 'json_schema'",
                    code="missing_required_parameter",
                )
            schema = response_format.json_schema.schema_ or JSON_OBJECT
            check_schema(schema, schema_param)
            fields["json_schema"] = schema
    except SchemaError as exc:
        raise invalid(exc.param, str(exc)) from None
    return fields


def message_calls(calls: list[ToolCallIn] | None) -> tuple[ToolCall, ...]:
    """An assistant message's earlier calls, as the engine takes them."""
    return tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in calls or ())


def check_tool_message(index: int, tool_call_id: str | None, known: dict[str, str]) -> str:
    """The tool name a ``role: "tool"`` message answers; 400 if it answers no earlier call."""
    param = f"messages[{index}].tool_call_id"
    if not tool_call_id:
        raise invalid(
            param, f"'{param}' is required on a tool message", code="missing_required_parameter"
        )
    if tool_call_id not in known:
        raise invalid(
            param,
            f"'{param}' ({tool_call_id}) answers no tool call of an earlier assistant message",
        )
    return known[tool_call_id]


def call_object(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """A call as a reply carries it (``index`` in a stream's ``delta.tool_calls``)."""
    out: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    return {"index": index, **out} if index is not None else out
