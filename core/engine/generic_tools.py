"""Tools on a chat template that takes none: the generic tool-call format.

Most GGUF and many MLX chat templates have no tool markup (Gemma 3's, SmolLM2's own):
handed ``tools=``, they drop them. For those, as llama.cpp's generic format does, the
tools are told to the model in words, the reply is held to a grammar, and the call is
read back:

- the prompt: :func:`render` puts :func:`instructions` (each tool as one line of JSON, its
  name, description and parameters less their ``$schema`` URL, then the reply format) in
  the system part, after the request's own system prompt; an earlier assistant call is
  written into its turn in the reply format, and a tool result goes back as a user turn
  (every template takes one)
  between ``<tool_result name="..." id="...">`` and ``</tool_result>``; turns of the same
  role next to each other become one (templates such as Gemma's insist that user and
  assistant alternate);
- the reply: either plain text (which never contains ``<tool_call>``), or one call::

      <tool_call>
      {"name":"TOOL","arguments":{...}}
      </tool_call>

  enforced by :func:`grammar` (llguidance, Lark with each tool's JSON schema), so the
  call always parses and names a listed tool. :data:`MARKUP` is what the scheduler's
  tool-call streaming (:class:`core.engine.tools.ToolCallText`) needs of it.

A tool schema may use JSON-schema keywords the grammar library refuses (Claude Code's
use ``propertyNames``): :func:`lenient_schema` drops them for the grammar (the model
still reads the whole schema), and falls back to "any object" where that is not enough.
A schema never turns a request away here.

Nothing here imports mlx: the prompt threads render with it.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import threading

from core.engine import constrain
from core.engine.constrain import (
    ToolMarkup,
    chosen_tools,
    has_tool_markup,
    tool_name,
    tool_parameters,
)
from core.engine.types import ChatMessage

log = logging.getLogger(__name__)

START, END = "<tool_call>", "</tool_call>"
ANY_OBJECT = {"type": "object"}
# a schema's keys that tell the model nothing about the arguments, left out of the prompt
# (Claude Code's 24 tools each start with a "$schema" URL: 552 of their 18,728 prompt
# tokens on gemma3-270m)
META_KEYWORDS = frozenset({"$schema", "$id", "$comment"})
# keywords dropped from a tool's schema when the grammar library refuses it as it is
UNENFORCED_KEYWORDS = META_KEYWORDS | frozenset(
    {
        "propertyNames",
        "patternProperties",
        "dependentSchemas",
        "dependentRequired",
        "dependencies",
        "if",
        "then",
        "else",
        "not",
        "unevaluatedProperties",
        "unevaluatedItems",
        "contains",
        "minContains",
        "maxContains",
        "uniqueItems",
        "format",
        "examples",
    }
)
_LENIENT: collections.OrderedDict[bytes, dict] = collections.OrderedDict()
_LENIENT_MAX = 1024
_LENIENT_LOCK = threading.Lock()


def applies(tokenizer) -> bool:
    """Whether tools on this model go in the generic format: its chat template has no tool
    markup mlx-lm parses (or it has no chat template)."""
    return not getattr(tokenizer, "has_chat_template", False) or not has_tool_markup(tokenizer)


def markup_for(tokenizer) -> ToolMarkup | None:
    """How the model's tool calls are written: the generic format where it applies, else its
    template's markup (engine thread: :func:`core.engine.constrain.tool_markup`)."""
    return MARKUP if applies(tokenizer) else constrain.tool_markup(tokenizer)


def parse(text: str, tools) -> dict:
    """The call between the markers: ``{"name": ..., "arguments": {...}}`` (ValueError if not)."""
    call = json.loads(text.strip())
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError("a call is an object with a name")
    if not isinstance(call.get("arguments", {}), dict):
        raise ValueError("a call's arguments are an object")
    return {"name": call["name"], "arguments": call.get("arguments", {})}


MARKUP = ToolMarkup(START, END, parse, json_calls=True, generic=True)


def call_text(name: str, arguments: str) -> str:
    """One call in the reply format (``arguments``: JSON text), as the model writes it."""
    try:
        value = json.loads(arguments)
    except ValueError:
        value = {}
    body = json.dumps({"name": name, "arguments": value}, ensure_ascii=False, separators=(",", ":"))
    return f"{START}\n{body}\n{END}"


def readable_schema(schema: dict) -> dict:
    """``schema`` as the model reads it: without its top level's meta keywords."""
    return {key: value for key, value in schema.items() if key not in META_KEYWORDS}


def instructions(tools) -> str:
    """The system part's text about ``tools`` and the reply format."""
    lines = [
        json.dumps(
            {
                "name": tool_name(tool),
                "description": (tool.get("function", tool).get("description") or ""),
                "parameters": readable_schema(tool_parameters(tool)),
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )
        for tool in tools
    ]
    return (
        "You can call these tools (one JSON object per line: the tool's name, what it does, "
        "and the JSON Schema of its arguments):\n"
        + "\n".join(lines)
        + "\n\nTo call a tool, reply with the call alone, in exactly this form:\n"
        + call_text("TOOL_NAME", '{"ARGUMENT":"VALUE"}')
        + "\nOtherwise reply with plain text. A tool's result comes back in the next user "
        'message, between <tool_result name="TOOL_NAME" id="CALL_ID"> and </tool_result>.'
    )


def turns(messages, tools) -> list[dict]:
    """``messages`` (the engine's :class:`ChatMessage`) as turns any template takes, with
    the tools told in the system part."""
    system, out = [], []
    for message in messages:
        if message.role == "system":
            system.append(message.content)
            continue
        if message.role == "tool":
            role = "user"
            text = (
                f'<tool_result name="{message.name or ""}" id="{message.tool_call_id or ""}">\n'
                f"{message.content}\n</tool_result>"
            )
        else:
            role = message.role
            calls = [call_text(c.name, c.arguments) for c in message.tool_calls]
            text = "\n".join(part for part in [message.content, *calls] if part)
        if out and out[-1]["role"] == role:
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": role, "content": text})
    system.append(instructions(tools))
    return [{"role": "system", "content": "\n\n".join(s for s in system if s)}, *out]


def render(tokenizer, messages: tuple[ChatMessage, ...], tools, extra: dict | None = None) -> str:
    """The prompt text with ``tools`` in the generic format (``extra``: more variables for
    the template). A template that refuses a system turn gets the tools' text at the start
    of the first user turn instead."""
    chat = turns(messages, tools)
    extra = extra or {}
    if not getattr(tokenizer, "has_chat_template", False):
        return "\n".join(f"{m['role']}: {m['content']}" for m in chat) + "\nassistant:"
    try:
        return tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=False, **extra
        )
    except Exception as exc:  # jinja2's TemplateError from raise_exception, or a KeyError
        if not chat[1:] or chat[1]["role"] != "user":
            raise
        log.info("the chat template refused a system turn (%s): tools go in the user turn", exc)
        merged = {"role": "user", "content": chat[0]["content"] + "\n\n" + chat[1]["content"]}
        return tokenizer.apply_chat_template(
            [merged, *chat[2:]], add_generation_prompt=True, tokenize=False, **extra
        )


def lenient_schema(schema) -> dict:
    """``schema`` as the grammar can enforce it: as it is if llguidance takes it, else without
    the keywords it cannot enforce, else any object. Remembered by digest (agents send the
    same tools every turn)."""
    if not isinstance(schema, dict):
        return ANY_OBJECT
    digest = hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).digest()
    with _LENIENT_LOCK:
        if digest in _LENIENT:
            _LENIENT.move_to_end(digest)
            return _LENIENT[digest]
    result = schema
    if not _enforceable(schema):
        result = _without(schema, UNENFORCED_KEYWORDS)
        if not _enforceable(result):
            log.info("a tool's schema cannot be enforced: its call is held to any object")
            result = ANY_OBJECT
    with _LENIENT_LOCK:
        _LENIENT[digest] = result
        while len(_LENIENT) > _LENIENT_MAX:
            _LENIENT.popitem(last=False)
    return result


def _enforceable(schema: dict) -> bool:
    return constrain.schema_problem(schema) is None


def _without(value, keywords: frozenset[str]):
    """``value`` with every object key in ``keywords`` dropped, at every depth (but never the
    names of properties: a property called ``format`` stays)."""
    if isinstance(value, list):
        return [_without(item, keywords) for item in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key in ("properties", "$defs", "definitions") and isinstance(item, dict):
            out[key] = {name: _without(sub, keywords) for name, sub in item.items()}
        elif key not in keywords:
            out[key] = _without(item, keywords)
    return out


def grammar_for(request, markup: ToolMarkup | None) -> str | None:
    """The grammar of ``request``'s reply (:func:`core.engine.constrain.grammar_for`), the
    generic format's where it applies: text or one call, or (forced) the call alone; a
    json_schema with tools under ``auto`` keeps the schema's grammar."""
    if markup is not None and markup.generic and request.tools and request.tool_choice != "none":
        forced = request.tool_choice in ("required", "function")
        if forced or request.json_schema is None:
            return grammar(chosen_tools(request), forced)
    return constrain.grammar_for(request, markup)


def grammar(tools, forced: bool) -> str:
    """The Lark grammar of a reply: one call of one of ``tools`` (their schemas made
    lenient), or (unless ``forced``) plain text without the call marker."""
    import llguidance

    schema = constrain.call_schema(tools, lambda t: lenient_schema(tool_parameters(t)))
    lark = (
        f"call: {json.dumps(START + chr(10))} body {json.dumps(chr(10) + END)}\n"
        f"body: %json {json.dumps(schema)}\n"
    )
    if forced:
        lark = "start: call\n" + lark
    else:
        lark = f"start: call | TEXT\nTEXT: /(?s:.+)/ & ~/(?s:.*){START}(?s:.*)/\n" + lark
    return llguidance.LLMatcher.grammar_from_lark(lark)
