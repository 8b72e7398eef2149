"""Constrained decoding with llguidance: JSON schemas and forced tool calls.

A request that asks for structured output (``json_schema``) or a forced tool call
(``tool_choice`` "required" or a named function) gets a grammar; on the engine thread
that grammar becomes a :class:`GrammarProcessor`, an mlx-lm logits processor (the
``processor(tokens, logits) -> logits`` of ``mlx_lm.sample_utils``) that keeps only the
tokens the grammar allows. It goes in the request's own processor list, so in the
scheduler's batched decode each row has its own constraint or none.

Why llguidance (measured: docs/benchmarks.md): it compiles a schema at once (an Earley
parser over a lexer, nothing precomputed over the vocabulary), computes a mask cheaply
for every token, takes Lark grammars
that embed JSON schemas (the ``<tool_call>`` wrapper around a call's JSON), and
reports unsupported schema features up front. outlines-core masks faster but compiles
each schema into a DFA over the whole vocabulary (slowly, and more slowly the larger the
schema) and takes only regular languages; xgrammar imports torch (and triton
on Linux) at import time, which this app does not ship.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from core.engine.grammar_schema import closed, has_local_references, hoisted, reference_loop
from core.errors import UserError

log = logging.getLogger(__name__)

# JSON that a small model cannot pad forever: no free whitespace between tokens.
JSON_OPTIONS = {"whitespace_flexible": False}
# Objects and arrays inside one another, at most. The schema checks recurse (a schema of
# 100 levels raised RecursionError in jsonschema: a 500), and a thread's stack is smaller
# than the main thread's on macOS; real tool schemas nest a dozen levels at most.
MAX_SCHEMA_DEPTH = 64
# Schemas that passed check_schema, by digest: agents send the same tools every turn, and
# jsonschema's meta-schema check costs about 10 µs a byte. Bounded (LRU), thread-safe.
_PASSED: collections.OrderedDict[tuple[bytes, bool], None] = collections.OrderedDict()
_PASSED_MAX = 4096
_PASSED_LOCK = threading.Lock()


class SchemaError(UserError):
    """A JSON schema (structured output or a tool's parameters) that cannot be used.
    ``param`` names the request field it came from, for the API's error body."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def check_schema(schema, param: str, enforced: bool = True) -> None:
    """Raise :class:`SchemaError` naming ``param`` if ``schema`` is not valid JSON Schema or,
    when decoding will be ``enforced`` against it, uses a feature the grammar library cannot
    enforce. A schema that passed is remembered (by digest): it is not checked again."""
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"{param} must be a JSON Schema object", param)
    if json_depth(schema) > MAX_SCHEMA_DEPTH:
        raise SchemaError(
            f"{param} is nested too deeply: more than {MAX_SCHEMA_DEPTH} levels of objects "
            "and arrays",
            param,
        )
    digest = hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).digest()
    if _passed(digest, enforced):
        return
    _check_schema(schema, param, enforced)
    with _PASSED_LOCK:
        _PASSED[digest, enforced] = None
        while len(_PASSED) > _PASSED_MAX:
            _PASSED.popitem(last=False)


def _passed(digest: bytes, enforced: bool) -> bool:
    with _PASSED_LOCK:
        for key in ((digest, True), (digest, False)) if not enforced else ((digest, True),):
            if key in _PASSED:
                _PASSED.move_to_end(key)
                return True
    return False


def _check_schema(schema, param: str, enforced: bool) -> None:
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise SchemaError(
            f"{param} is not a valid JSON Schema: {exc.message}"
            + (f" (at {where})" if where else ""),
            param,
        ) from None
    if not enforced:
        return
    problem = schema_problem(schema)
    if problem:
        raise SchemaError(
            f"{param} uses an unsupported schema feature: {problem.splitlines()[-1]}", param
        )


def schema_problem(schema) -> str | None:
    """Why the grammar library cannot enforce ``schema`` as the grammar uses it (extra
    properties off where it does not say, and hoisted under a call's ``$defs`` where it
    refers to itself: :func:`call_schema`); None if it can."""
    import llguidance

    loop = reference_loop(schema)
    if loop is not None:
        return f"$ref {loop!r} refers only to itself: no value can match it"
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            embedded(closed(schema), "schema"), defaults=JSON_OPTIONS
        )
        return llguidance.LLMatcher.validate_grammar(grammar) or None
    except (ValueError, TypeError) as exc:
        return str(exc) or type(exc).__name__


def embedded(schema, name: str) -> dict:
    """``schema`` as another document's ``$defs/<name>`` plus a root that is it: what
    :func:`call_schema` does to a tool's arguments that refer to themselves."""
    if not has_local_references(schema):
        return schema
    return {"$ref": f"#/$defs/{name}", "$defs": {name: hoisted(schema, f"/$defs/{name}")}}


def json_depth(value) -> int:
    """How many objects and arrays deep ``value`` (JSON as Python values) goes; without
    recursion, so any depth is measured."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        )
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def first_line(error: str) -> str:
    """The first line of llguidance's error text (the rest repeats the whole grammar)."""
    return error.strip().splitlines()[0] if error.strip() else "unknown error"


def tool_name(tool: dict) -> str:
    """The function name of an OpenAI-style tool (``{"type": "function", "function": ...}``)."""
    function = tool.get("function", tool)
    return str(function.get("name", ""))


def tool_parameters(tool: dict) -> dict:
    function = tool.get("function", tool)
    return function.get("parameters") or {"type": "object", "properties": {}}


def check_tools(tools, tool_choice: str, name: str | None) -> None:
    """Raise :class:`SchemaError` naming the field for a tool without a name, a tool whose
    parameters are not a usable JSON schema, or a ``tool_choice`` naming no given tool.
    Only the tools a call will be constrained to (``required``: all; a named function: that
    one) must fit the grammar library; under ``auto`` a schema it can't enforce is fine, as
    agents send large tool schemas that the model only reads."""
    names = []
    for i, tool in enumerate(tools):
        if not tool_name(tool):
            raise SchemaError(f"tools[{i}].function.name is missing", f"tools[{i}].function.name")
        names.append(tool_name(tool))
        enforced = tool_choice == "required" or (
            tool_choice == "function" and tool_name(tool) == name
        )
        check_schema(tool_parameters(tool), f"tools[{i}].function.parameters", enforced)
    if tool_choice in ("required", "function") and not tools:
        raise SchemaError(f"tool_choice {tool_choice!r} needs tools", "tool_choice")
    if tool_choice == "function" and name not in names:
        raise SchemaError(
            f"tool_choice names {name!r}, which is not among the tools ({', '.join(names)})",
            "tool_choice",
        )


def check_request(request) -> None:
    """A request's tools and JSON schema, as :func:`check_tools` and :func:`check_schema`
    check them (on a prompt thread, never the engine thread: checks cost ~10 µs a byte)."""
    if request.tools:
        check_tools(request.tools, request.tool_choice, request.tool_name)
    if request.json_schema is not None:
        check_schema(request.json_schema, "response_format.json_schema.schema")


@dataclass(frozen=True)
class ToolMarkup:
    """How a model writes a tool call: between ``start`` and ``end``, parsed by ``parse``
    (mlx-lm's tool parser for the model's template)."""

    start: str
    end: str
    parse: object  # (text, tools) -> dict | list[dict]
    json_calls: bool  # the call between the markers is {"name": ..., "arguments": {...}}
    generic: bool = False  # RadixChat's own format, for templates that take no tools
    # the markers' token ids where each is one special token of the vocabulary (Qwen's
    # <tool_call> is id 151657): the grammar names that token, not its text, which
    # llguidance never matches to a special token
    start_id: int | None = None
    end_id: int | None = None


def has_tool_markup(tokenizer) -> bool:
    """Whether the model writes tool calls in a markup mlx-lm parses (its tokenizer
    wrapper's ``has_tool_calling``); imports nothing, for the prompt threads."""
    return bool(getattr(tokenizer, "has_tool_calling", False))


def tool_markup(tokenizer) -> ToolMarkup | None:
    """The model's tool-call markup, from its tokenizer wrapper; None if it has none
    (engine thread: it imports mlx-lm's internals, ``core.mlx_lm_compat``)."""
    if not has_tool_markup(tokenizer):
        return None
    from core.mlx_lm_compat import writes_json_tool_calls

    parse = tokenizer.tool_parser
    start, end = tokenizer.tool_call_start, tokenizer.tool_call_end
    return ToolMarkup(
        start,
        end,
        parse,
        writes_json_tool_calls(parse),
        start_id=special_token_id(tokenizer, start),
        end_id=special_token_id(tokenizer, end),
    )


def special_token_id(tokenizer, text: str) -> int | None:
    """The id of ``text`` where it is one added (special) token of the vocabulary, else None."""
    from core.mlx_lm_compat import hf_tokenizer

    hf = hf_tokenizer(tokenizer)
    if not text:
        return None
    try:
        ids = hf.encode(text, add_special_tokens=False)
    except Exception:  # a tokenizer without encode's keyword: no special handling
        return None
    added = getattr(hf, "added_tokens_decoder", {}) or {}
    return int(ids[0]) if len(ids) == 1 and ids[0] in added else None


def _marker(text: str, token: int | None) -> str:
    """A tool-call marker in the lark grammar: its special token, or its text."""
    return f"<[{token}]>" if token is not None else json.dumps(text)


def call_schema(tools: list[dict], arguments=tool_parameters) -> dict:
    """The JSON schema of one call of one of ``tools`` (``{"name": ..., "arguments": ...}``),
    with llguidance's options; ``arguments(tool)`` gives a tool's arguments' schema. Each
    tool's arguments have extra properties off where their schema does not say, and, where
    they point inside themselves (``$ref`` into ``$defs``, as pydantic writes), sit under
    the call's ``$defs`` with their references rebased (:mod:`core.engine.grammar_schema`)."""
    definitions, calls = {}, []
    for i, tool in enumerate(tools):
        schema = closed(arguments(tool))
        if has_local_references(schema):
            definitions[f"tool{i}"] = hoisted(schema, f"/$defs/tool{i}")
            schema = {"$ref": f"#/$defs/tool{i}"}
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool_name(tool)}, "arguments": schema},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    call = {"anyOf": calls} if len(calls) > 1 else calls[0]
    if definitions:
        call = {**call, "$defs": definitions}
    return {**call, "x-guidance": JSON_OPTIONS}


def chosen_tools(request) -> list[dict]:
    """The tools a reply may call: the named one under tool_choice "function", else all."""
    return [
        t
        for t in request.tools
        if request.tool_choice != "function" or tool_name(t) == request.tool_name
    ]


def grammar_for(request, markup: ToolMarkup | None) -> str | None:
    """The llguidance grammar constraining ``request``'s reply, or None for free text."""
    forced = request.tools and request.tool_choice in ("required", "function")
    if not forced and request.json_schema is None:
        return None
    import llguidance

    if forced:
        if markup is None or not markup.json_calls:
            raise UserError(
                "this model's tool-call format cannot be constrained: use tool_choice "
                '"auto", or give a chat template with JSON <tool_call> markup'
            )
        tools = chosen_tools(request)
        schema = call_schema(tools)
        start, end = _marker(markup.start, markup.start_id), _marker(markup.end, markup.end_id)
        lark = f'start: {start} "\\n" call "\\n" {end}\ncall: %json {json.dumps(schema)}\n'

        return llguidance.LLMatcher.grammar_from_lark(lark)
    if request.json_schema is not None:
        return llguidance.LLMatcher.grammar_from_json_schema(
            closed(request.json_schema), defaults=JSON_OPTIONS
        )
    return None


class GrammarProcessor:
    """An mlx-lm logits processor enforcing one grammar for one request (engine thread).

    ``tokens`` is the request's whole context (prompt, then what was generated): the
    tokens past ``seen`` are fed to the matcher before the next mask is computed. A
    finished grammar allows only end-of-sequence tokens. ``cpu_s`` adds up the engine
    thread's CPU time spent here (feeding the matcher, computing and applying masks): the
    constraint's own cost, apart from waiting for the sampled token.

    A grammar can fail part-way (llguidance has limits: an ``anyOf`` of 2,100 objects
    passes every check up front, then overflows its parser's row after ``{"``). Then
    ``failure`` says why and only end-of-sequence is allowed, so the row ends at its next
    step; the scheduler ends the request with that error, never with the partial text as
    a finished reply.
    """

    def __init__(self, matcher, seen: int, vocab: int, eos: list[int]):
        self.matcher = matcher
        self.seen = seen
        self.vocab = vocab
        self.eos = np.array(sorted(eos), dtype=np.int64)
        self.cpu_s = 0.0
        self.failure: str | None = None  # why the grammar failed, if it did

    def __call__(self, tokens, logits):
        # waits for the token
        new = tokens[self.seen :].tolist() if int(tokens.shape[-1]) > self.seen else []
        started = time.thread_time()
        try:
            return self._mask(new, logits)
        finally:
            self.cpu_s += time.thread_time() - started

    def _mask(self, new: list[int], logits):
        import mlx.core as mx

        if new:
            self.seen += len(new)
            for token in new:
                if self.failure is not None or self.matcher.is_stopped():
                    break  # what follows a finished (or failed) grammar is end-of-sequence
                if not self.matcher.consume_token(int(token)):
                    self._fail(self.matcher.get_error() or f"token {token} was refused")
        if self.failure is None and self.matcher.is_error():
            self._fail(self.matcher.get_error())
        if self.failure is not None or self.matcher.is_stopped():
            allowed = np.zeros(self.vocab, dtype=bool)
        else:
            allowed = (
                np.frombuffer(self.matcher.compute_logit_bias(), dtype=np.uint8)[: self.vocab] > 0
            )
            if self.matcher.is_error():
                self._fail(self.matcher.get_error())
                allowed = np.zeros(self.vocab, dtype=bool)
            elif not allowed.any():
                self._fail("no token can continue the output")
        if not allowed.any():
            allowed = allowed.copy()
            allowed[self.eos[self.eos < self.vocab]] = True
        width = logits.shape[-1]
        if width > self.vocab:
            allowed = np.concatenate([allowed, np.zeros(width - self.vocab, dtype=bool)])
        return mx.where(mx.array(allowed[:width]), logits, -mx.inf)

    def _fail(self, error: str) -> None:
        self.failure = first_line(error)
        log.warning("the output constraint failed: %s", self.failure)


class Grammars:
    """Builds grammar processors for one loaded model (engine thread). The llguidance view of
    the tokenizer is built once, on first use (about a second for a 49k vocabulary)."""

    def __init__(self, tokenizer, vocab: int):
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.eos = sorted(tokenizer.eos_token_ids)
        self._llg = None

    def processor(self, grammar: str, prompt_length: int) -> GrammarProcessor:
        import llguidance
        import llguidance.hf

        if self._llg is None:
            from core.mlx_lm_compat import hf_tokenizer

            self._llg = llguidance.hf.from_tokenizer(
                hf_tokenizer(self.tokenizer), n_vocab=self.vocab, eos_token=self.eos
            )
        matcher = llguidance.LLMatcher(self._llg, grammar, log_level=0)
        if matcher.is_error():
            raise UserError(
                f"the output constraint cannot be used: {first_line(matcher.get_error())}"
            )
        return GrammarProcessor(matcher, prompt_length, self.vocab, self.eos)
