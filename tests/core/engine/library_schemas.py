"""Tool schemas as libraries write them, for the schema tests of the engine and the API:
pydantic's ``model_json_schema()`` of real models (nested models through ``$ref`` into
``$defs``, ``Optional``, an enum, recursion), the same in pydantic 1's draft-07 shape
(``definitions``), and the tool lists of two published MCP servers
(``tests/core/api/tool_schemas/``)."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, Field

MCP_LISTS = Path(__file__).parents[2] / "core" / "api" / "tool_schemas"


class Unit(StrEnum):
    C = "C"
    F = "F"


class Loc(BaseModel):
    city: str = Field(max_length=8)
    country: str | None = Field(default=None, max_length=4)


class Weather(BaseModel):
    """The weather of a place."""

    loc: Loc
    unit: Unit
    days: int | None = Field(default=None, ge=1, le=7)


class Node(BaseModel):
    name: str = Field(max_length=4)
    children: list[Node] = Field(default_factory=list, max_length=2)


class Tree(BaseModel):
    """A tree of names."""

    root: Node


def draft7(model: type[BaseModel]) -> dict:
    """``model``'s schema as pydantic 1 wrote it: its models under ``definitions``."""
    schema = model.model_json_schema(ref_template="#/definitions/{model}")
    schema["definitions"] = schema.pop("$defs")
    return schema


# name -> (schema, its pydantic model or None)
PYDANTIC = {
    "weather": (Weather.model_json_schema(), Weather),
    "weather_draft7": (draft7(Weather), Weather),
    "tree": (Tree.model_json_schema(), Tree),
    "node": (Node.model_json_schema(), Node),  # the root itself a $ref into $defs
}
EXAMPLES = {
    "weather": Weather(loc=Loc(city="Paris"), unit=Unit.C, days=3),
    "weather_draft7": Weather(loc=Loc(city="Oslo", country="NO"), unit=Unit.F),
    "tree": Tree(root=Node(name="a", children=[Node(name="b", children=[Node(name="c")])])),
    "node": Node(name="a", children=[Node(name="b")]),
}


def function_tool(name: str, schema: dict, description: str = "") -> dict:
    """An OpenAI-style tool with ``schema`` as its parameters."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


def pydantic_tools() -> list[dict]:
    return [function_tool(name, schema) for name, (schema, _) in PYDANTIC.items()]


def mcp_tools(server: str) -> list[dict]:
    """The tools an MCP server lists (``filesystem`` or ``fetch``), as OpenAI tools."""
    listed = json.loads((MCP_LISTS / f"mcp_{server}.json").read_text())["tools"]
    return [function_tool(t["name"], t["inputSchema"], t.get("description", "")) for t in listed]
