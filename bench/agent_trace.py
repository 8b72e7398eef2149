"""The coding-agent session ``radixchat bench agent`` replays, and its two wire forms.

Two agents share one system prompt and one set of tool definitions (about 2,000 tokens
together, as a coding agent's are); each works on its own task through ten rounds of a
tool call and its result (outputs of 100-300 tokens: source files, search hits, test
runs), then is asked for a one-line summary with a stop sequence. The agents' requests
interleave (A1, B1, A2, B2, ...). Everything is generated from fixed seeds, so every run,
and every server, gets the same requests. The assistant turns are scripted (the calls an
agent made), so the history does not depend on what the model under test replies.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

ROUNDS = 10
STOP_SEQUENCES = ("\n",)

RULES = (
    (
        "Read the code before you change it: open every file you intend to edit and the tests "
        "that cover it."
    ),
    (
        "Make the smallest change that solves the task; do not reformat code you did not "
        "otherwise touch."
    ),
    "Keep the project's style: naming, docstrings, error handling and the layout of its modules.",
    "Never invent an API: search the code base for how a function is called before calling it.",
    "Run the tests that cover your change after every edit, and the whole suite before you finish.",
    (
        "When a test fails, read its output completely, find the cause, and fix the cause, not "
        "the test."
    ),
    (
        "Do not add dependencies without saying why; prefer the standard library and what the "
        "project uses."
    ),
    "Write tests for new behaviour next to the existing tests of the module, in the same style.",
    (
        "Errors meant for the user are one clear line; bugs keep their traceback. Do not swallow "
        "exceptions."
    ),
    "Do not leave debugging output, commented-out code or TODO notes in the files you hand back.",
    (
        "Use the tools one at a time and wait for each result; do not guess what a command would "
        "print."
    ),
    "Paths are relative to the repository root. Never touch files outside the repository.",
    "Long outputs are cut: ask for a line range when you need a part of a large file.",
    "Commit messages say what changed and why, in the imperative, in one paragraph.",
    (
        "When the task is ambiguous, pick the reading that keeps existing behaviour and say so "
        "in the summary."
    ),
    (
        "Security matters: never print secrets, never disable certificate checks, never widen "
        "permissions."
    ),
    "Prefer clear data types (dataclasses, enums) to dictionaries of loosely named fields.",
    "Performance claims need a measurement: state the command you ran and the figures it printed.",
    (
        "Keep functions short and named for what they do; split a module that grows past a few "
        "hundred lines."
    ),
    "Answer in English, briefly. Report what you changed, what you ran and what you left undone.",
)
AREAS = (
    "storage",
    "http",
    "cli",
    "scheduler",
    "cache",
    "parser",
    "metrics",
    "auth",
    "config",
    "models",
)
ROLES = (
    "reads and writes records",
    "routes requests",
    "parses arguments",
    "orders the work queue",
    "keeps recent results",
    "turns text into tokens",
    "counts events",
    "checks credentials",
    "loads settings",
    "describes the data",
)

TOOLS = (
    {
        "name": "read_file",
        "description": (
            "Read a text file of the repository. Returns the file's lines, numbered. Use "
            "start_line and end_line to read a part of a long file; without them the first 400 "
            "lines come back."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "the file's path, relative to the repository root",
                },
                "start_line": {"type": "integer", "description": "first line to return (1-based)"},
                "end_line": {"type": "integer", "description": "last line to return (inclusive)"},
            },
            "required": ["path"],
        },
    },
    {
        "name": "edit_file",
        "description": (
            "Replace one exact occurrence of old_text with new_text in a file. Fails if old_text "
            "is missing or occurs more than once: include enough surrounding lines to make it "
            "unique."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "the file to edit"},
                "old_text": {
                    "type": "string",
                    "description": "the exact text to replace, whitespace included",
                },
                "new_text": {"type": "string", "description": "the replacement text"},
            },
            "required": ["path", "old_text", "new_text"],
        },
    },
    {
        "name": "search_code",
        "description": "Search the repository for a regular expression. Returns matching lines as "
        "path:line: text, at most 50 of them, in path order.",
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {
                    "type": "string",
                    "description": "a regular expression (Python syntax)",
                },
                "path": {
                    "type": "string",
                    "description": "a folder or file to search in (default: everything)",
                },
            },
            "required": ["pattern"],
        },
    },
    {
        "name": "run_tests",
        "description": (
            "Run the test suite, or part of it, with pytest. Returns the last 60 lines of its "
            "output and the exit status."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "target": {
                    "type": "string",
                    "description": "a test file, a test id (file::name) or a folder",
                },
                "keyword": {
                    "type": "string",
                    "description": "only tests whose name matches (pytest -k)",
                },
            },
            "required": [],
        },
    },
    {
        "name": "run_command",
        "description": (
            "Run a shell command in the repository root with a time limit. Returns its standard "
            "output and error, cut to 4,000 characters, and its exit status. No network access."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "the command line"},
                "timeout_s": {
                    "type": "integer",
                    "description": "time limit in seconds (default 60)",
                },
            },
            "required": ["command"],
        },
    },
    {
        "name": "list_directory",
        "description": (
            "List a folder of the repository: names, sizes, and a trailing slash on folders."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "the folder (default: the repository root)",
                }
            },
            "required": [],
        },
    },
)
TASKS = (
    (
        "The storage module loses the last record when the file does not end with a newline. "
        "Find the bug, fix it and add a test."
    ),
    "Add a --limit option to the cli's list command that prints at most N entries, with a test.",
)


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: dict


@dataclass(frozen=True)
class Message:
    """A message of the neutral trace: ``role`` user, assistant (maybe with calls) or tool."""

    role: str
    text: str
    calls: tuple[Call, ...] = ()
    call_id: str | None = None


@dataclass(frozen=True)
class Request:
    """One request of the replay: ``agent``'s first ``upto`` messages (plus ``extra``)."""

    agent: int
    messages: tuple[Message, ...]
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Trace:
    system: str
    tools: tuple[dict, ...]
    requests: tuple[Request, ...] = field(default_factory=tuple)


def system_prompt() -> str:
    rng = random.Random(7)
    lines = [
        "You are a coding agent working in a Python repository on the user's machine. You change "
        "code by calling the tools you are given, one call at a time, and you answer when the task "
        "is done.",
        "",
        "# Rules",
        "",
    ]
    lines += [f"{i}. {rule}" for i, rule in enumerate(RULES, 1)]
    lines += ["", "# The repository", ""]
    for area, role in zip(AREAS, ROLES):
        for n in range(rng.randint(1, 3)):
            lines.append(
                f"- src/app/{area}/{area}_{n}.py: {role} ({rng.randint(80, 600)} lines, tested in "
                f"tests/{area}/test_{area}_{n}.py)"
            )
    return "\n".join(lines)


def _source(rng: random.Random, path: str, lines: int) -> str:
    area = path.split("/")[2]
    out, n = [], 1
    while len(out) < lines:
        name = (
            f"{rng.choice(('load', 'save', 'parse', 'check', 'merge', 'split'))}_{area}_"
            f"{rng.randint(1, 99)}"
        )
        body = [
            f"def {name}(items, limit={rng.randint(1, 64)}):",
            f'    """{rng.choice(ROLES).capitalize()} for the {area} module."""',
            "    result = []",
            "    for item in items[:limit]:",
            f"        if item.{rng.choice(('key', 'size', 'name'))} is None:",
            "            continue",
            "        result.append(item)",
            "    return result",
            "",
        ]
        for line in body:
            out.append(f"{n:4d}  {line}")
            n += 1
    return "\n".join(out[:lines])


def _output(rng: random.Random, call: Call) -> str:
    """A tool result of roughly 100-300 tokens for ``call``."""
    if call.name == "read_file":
        return _source(rng, call.arguments["path"], rng.randint(9, 17))
    if call.name == "search_code":
        area = rng.choice(AREAS)
        return "\n".join(
            f"src/app/{area}/{area}_{rng.randint(0, 4)}.py:{rng.randint(5, 400)}: "
            f"    value = {call.arguments['pattern']}(items, limit={rng.randint(1, 64)})"
            for _ in range(rng.randint(5, 9))
        )
    if call.name == "run_tests":
        passed = rng.randint(20, 90)
        lines = [
            (
                f"tests/{rng.choice(AREAS)}/test_{rng.choice(AREAS)}_{i}.py "
                f"....{'.' * rng.randint(1, 20)}"
            )
            for i in range(rng.randint(6, 10))
        ]
        lines += [
            "",
            "FAILED tests/storage/test_storage_1.py::test_last_record - AssertionError: "
            f"assert {rng.randint(2, 9)} == {rng.randint(10, 20)}",
            f"{rng.randint(1, 3)} failed, {passed} passed in {rng.uniform(1, 9):.2f}s",
        ]
        return "\n".join(lines)
    if call.name == "edit_file":
        return (
            f"edited {call.arguments['path']}: 1 replacement, {rng.randint(2, 9)} lines changed\n"
            + _source(rng, call.arguments["path"], rng.randint(8, 12))
        )
    if call.name == "list_directory":
        area = rng.choice(AREAS)
        return "\n".join(
            f"{area}_{i}.py  {rng.randint(900, 20000)}" for i in range(rng.randint(16, 26))
        )
    return f"exit status 0\n{_source(rng, 'src/app/cli/cli_0.py', rng.randint(9, 16))}"


def _call(rng: random.Random, agent: int, step: int) -> Call:
    area = ("storage", "cli")[agent]
    path = f"src/app/{area}/{area}_{rng.randint(0, 3)}.py"
    name = (
        "search_code",
        "read_file",
        "read_file",
        "run_tests",
        "edit_file",
        "read_file",
        "run_tests",
        "list_directory",
        "edit_file",
        "run_tests",
    )[step % 10]
    arguments = {
        "search_code": {"pattern": f"{area}_records", "path": f"src/app/{area}"},
        "read_file": {"path": path, "start_line": 1, "end_line": rng.randint(40, 120)},
        "run_tests": {"target": f"tests/{area}", "keyword": "record"},
        "edit_file": {
            "path": path,
            "old_text": "    return result",
            "new_text": "    return result[:limit]",
        },
        "list_directory": {"path": f"src/app/{area}"},
    }[name]
    return Call(f"toolu_{agent}{step:02d}{rng.randint(1000, 9999)}", name, arguments)


def build_trace(rounds: int = ROUNDS) -> Trace:
    """The replay: two agents, ``rounds`` tool rounds each, interleaved, then the stop turns."""
    per_agent: list[list[Request]] = []
    for agent, task in enumerate(TASKS):
        rng = random.Random(100 + agent)
        history = [Message("user", task)]
        requests = [Request(agent, tuple(history))]
        for step in range(rounds):
            call = _call(rng, agent, step)
            history.append(Message("assistant", f"Step {step + 1}: calling {call.name}.", (call,)))
            history.append(Message("tool", _output(rng, call), call_id=call.id))
            requests.append(Request(agent, tuple(history)))
        history.append(Message("assistant", "The change is made and the tests pass."))
        history.append(Message("user", "Summarise the change in one line."))
        requests.append(Request(agent, tuple(history), STOP_SEQUENCES))
        per_agent.append(requests)
    interleaved = [r for pair in zip(*per_agent) for r in pair]
    return Trace(system_prompt(), TOOLS, tuple(interleaved))


# ------------------------------------------------------------------ wire forms
def openai_body(trace: Trace, request: Request, max_tokens: int) -> dict:
    """``/v1/chat/completions``: the system message, tool calls and ``role: tool`` results."""
    messages: list[dict] = [{"role": "system", "content": trace.system}]
    for m in request.messages:
        if m.role == "tool":
            messages.append({"role": "tool", "tool_call_id": m.call_id, "content": m.text})
        elif m.calls:
            messages.append(
                {
                    "role": "assistant",
                    "content": m.text,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                        }
                        for c in m.calls
                    ],
                }
            )
        else:
            messages.append({"role": m.role, "content": m.text})
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "tools": [{"type": "function", "function": t} for t in trace.tools],
    }
    if request.stop:
        body["stop"] = list(request.stop)
    return body


def anthropic_body(trace: Trace, request: Request, max_tokens: int) -> dict:
    """``/v1/messages``: ``system``, ``tool_use`` blocks, ``tool_result`` blocks in user turns."""
    messages: list[dict] = []
    for m in request.messages:
        if m.role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.call_id, "content": m.text}
            if (
                messages
                and messages[-1]["role"] == "user"
                and isinstance(messages[-1]["content"], list)
            ):
                messages[-1]["content"].append(block)
            else:
                messages.append({"role": "user", "content": [block]})
        elif m.calls:
            messages.append(
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": m.text}]
                    + [
                        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                        for c in m.calls
                    ],
                }
            )
        else:
            messages.append({"role": m.role, "content": m.text})
    body = {
        "model": "claude-sonnet-4-5",
        "system": trace.system,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "tools": [
            {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
            for t in trace.tools
        ],
    }
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    return body
