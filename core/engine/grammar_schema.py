"""JSON schemas as clients and libraries write them, made ready for the grammar.

Two things clients write differ from what the grammar library (llguidance) should enforce:

- **References.** pydantic's ``model_json_schema()`` and most MCP servers put nested models
  in ``$defs`` (``definitions`` in draft-07) and point at them with ``{"$ref":
  "#/$defs/Loc"}``. A ``#`` pointer is read from the root of the schema it is in; a tool's
  arguments are not the root of a call's schema (``{"name": ..., "arguments": ...}``), so
  :func:`hoisted` moves a schema under the call's own ``$defs`` and rebases every local
  ``$ref`` onto its new place. Nothing is inlined: a recursive model stays one rule of the
  grammar that calls itself, so a cycle costs nothing to compile. A cycle made of
  references alone (``A`` is ``B``, ``B`` is ``A``: no value can match) is found by
  :func:`reference_loop` and refused by name.
- **Extra properties.** A schema that does not say ``additionalProperties`` allows any
  other key (JSON Schema's default), and a small model given that freedom pads the object
  with invented keys until ``max_tokens`` (issue 43). As llama.cpp's grammars do,
  :func:`closed` turns extra keys off where a schema lists ``properties`` and says nothing
  about others; ``"additionalProperties": true`` (or a schema for them) is kept as written,
  and an object without ``properties`` (``{"type": "object"}``) stays any object. Objects
  combined with ``allOf`` are left open: each part lists only some of the keys.

The schema a model reads in its prompt is the client's own; only the grammar's copy changes.
"""

from __future__ import annotations

# keywords whose value is one schema, a list of schemas, or names mapped to schemas
ONE_SCHEMA = frozenset(
    {
        "additionalProperties",
        "additionalItems",
        "items",
        "contains",
        "not",
        "if",
        "then",
        "else",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
# what a schema that is nothing but a reference may say besides its $ref
REFERENCE_ANNOTATIONS = frozenset(
    {"$ref", "title", "description", "default", "examples", "$comment", "$defs", "definitions"}
)
# the keys of an object schema that already say what other keys may do, or that combine it
# with schemas whose keys it does not list
OPEN_KEYS = frozenset(
    {
        "additionalProperties",
        "patternProperties",
        "unevaluatedProperties",
        "allOf",
        "anyOf",
        "oneOf",
        "$ref",
        "if",
    }
)
# keys of a top-level schema that mean something only at the root of a document
ROOT_ONLY = frozenset({"$schema", "$id", "$comment"})


def _rebuilt(schema, change, path: str = ""):
    """A copy of ``schema`` with ``change(node, path)`` applied to every schema in it, its
    subschemas rebuilt first (``path``: the node's JSON pointer from the root). Values
    that are data (``enum``, ``const``, ``default``, ``examples``) are never walked."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        here = f"{path}/{_escape(key)}"
        if key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {
                name: _rebuilt(sub, change, f"{here}/{_escape(name)}")
                for name, sub in value.items()
            }
        elif key in SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_rebuilt(sub, change, f"{here}/{i}") for i, sub in enumerate(value)]
        elif key in ONE_SCHEMA and isinstance(value, dict):
            out[key] = _rebuilt(value, change, here)
        else:
            out[key] = value
    return change(out, path)


def _escape(name: str) -> str:
    """A name as one token of a JSON pointer (RFC 6901)."""
    return str(name).replace("~", "~0").replace("/", "~1")


def closed(schema):
    """``schema`` with extra properties off wherever it lists ``properties`` and says
    nothing about other keys (``additionalProperties`` missing means false, as in
    llama.cpp's grammars); what it does say is kept."""
    if not isinstance(schema, dict):
        return schema
    combined = _combined(schema)

    def close(node: dict, path: str) -> dict:
        if (
            isinstance(node.get("properties"), dict)
            and not OPEN_KEYS & node.keys()
            and "#" + path not in combined
            and node.get("type", "object") in ("object", ["object"])
        ):
            return {**node, "additionalProperties": False}
        return node

    return _rebuilt(schema, close)


def _combined(schema: dict) -> set[str]:
    """The local pointers (``#/...``) of every schema that is a part of an ``allOf``, directly
    or through a ``$ref``: they hold only some of an object's keys, so they stay open."""
    parts: set[str] = set()

    def collect(node: dict, path: str) -> dict:
        for i, part in enumerate(node.get("allOf") or []):
            if isinstance(part, dict):
                parts.add(f"#{path}/allOf/{i}")
                if isinstance(part.get("$ref"), str):
                    parts.add(part["$ref"])
        return node

    _rebuilt(schema, collect)
    return parts


def has_local_references(schema) -> bool:
    """Whether ``schema`` has a ``$ref`` to a place inside itself (``#...``)."""
    found = []

    def look(node: dict, path: str) -> dict:
        if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
            found.append(path)
        return node

    _rebuilt(schema, look)
    return bool(found)


def hoisted(schema, pointer: str):
    """``schema`` as it reads when placed at ``pointer`` (``/$defs/tool0``) of another
    document: every local ``$ref`` rebased onto that place (``#/$defs/Loc`` becomes
    ``#/$defs/tool0/$defs/Loc``; ``#`` itself, recursion into the whole schema,
    ``#/$defs/tool0``), and the keys that mean something only at a root dropped."""
    if not isinstance(schema, dict):
        return schema

    def rebase(node: dict, path: str) -> dict:
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            return {**node, "$ref": "#" + pointer + ref[1:]}
        return node

    return {k: v for k, v in _rebuilt(schema, rebase).items() if k not in ROOT_ONLY}


def reference_loop(schema) -> str | None:
    """A local ``$ref`` that leads back to itself through references alone (no value can
    match it: ``A`` is ``B`` and ``B`` is ``A``), as its pointer; None if there is none.
    Recursion through properties or items is fine, and is not one."""
    if not isinstance(schema, dict):
        return None
    targets: dict[str, str] = {}  # a schema that is nothing but a $ref: where it points

    def note(node: dict, path: str) -> dict:
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and _only_reference(node):
            targets["#" + path] = ref
        return node

    _rebuilt(schema, note)
    for start in targets:
        seen, at = {start}, targets[start]
        while at in targets:
            if at in seen:
                return at
            seen.add(at)
            at = targets[at]
    return None


def _only_reference(node: dict) -> bool:
    """Whether a schema says nothing but its ``$ref`` (annotations aside)."""
    return node.keys() <= REFERENCE_ANNOTATIONS
