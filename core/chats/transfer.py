"""Chats in and out of the store: export one as Markdown (to read) or JSON (to keep or move),
import a JSON one as a new chat.

A JSON export holds the chat's title, system prompt and settings, and each message; a reply
carries the model and the sampling settings it was made with (``ChatTurn`` stores them beside
the engine's figures) and those figures, a reasoning model's reply its thinking
(``reasoning``), and a reply that used tools its tool loop (``tool_steps``: each step's
calls and results, images as base64, as :mod:`core.chats.tool_steps` describes them; only
calls and results: nothing of an MCP server's configuration is ever in a chat). The
Markdown export shows each call (its name, its arguments in a code block) and its result
(text; an image as ``[image]``). Import takes such a file, or a plain list of
``{"role", "content"}`` messages (what most tools write), and makes a new chat of it: its KV
cache is built on its first reply. Anything that is not a chat is one clear line
(:class:`~core.errors.UserError`), and nothing is written: a malformed tool step too.

No mlx and no Qt here: the command line (``radixchat chats export/import``) and the window
share these functions.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from core.chats import settings as chat_settings
from core.chats import tool_steps
from core.chats.settings import RANGES, SAMPLING_KEYS, short_repr
from core.chats.store import ChatStore, Message, Session, readable
from core.engine.constrain import json_depth
from core.errors import UserError

FORMAT = "radixchat-chat"
VERSION = 1
ROLES = ("system", "user", "assistant")
# objects and arrays inside one another in a chat file, at most (an export goes 4 deep)
MAX_DEPTH = 32
# the keys of a reply's stored figures that say how it was made (the rest: the engine's)
TURN_KEYS = ("model", "sampling")


@dataclass(frozen=True)
class Imported:
    """What an import made: the new chat and how many messages it holds."""

    session: Session
    messages: int


def export_json(store: ChatStore, session_id: int) -> dict:
    """The chat as a JSON-ready dict (see the module docstring)."""
    session, messages = _read(store, session_id)
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "title": session.title,
        "name": session.name,
        "system_prompt": session.system_prompt,
        "settings": session.settings,
        "created_at": session.created_at,
        **_branch_json(store, session),
        "messages": [_message_json(m) for m in messages],
    }


def _branch_json(store: ChatStore, session: Session) -> dict:
    """A branch's link to the chat it came from (by name) and its fork point."""
    if session.fork_seq is None:
        return {}
    parent = store.get_session_by_id(session.parent_id) if session.parent_id else None
    return {"branch_of": parent.name if parent else None, "fork_seq": session.fork_seq}


def export_markdown(store: ChatStore, session_id: int) -> str:
    """The chat to read: a heading, the system prompt, then each message under its role (a
    reply's heading names its model and settings)."""
    session, messages = _read(store, session_id)
    lines = [f"# {session.title or session.name}", ""]
    if session.system_prompt:
        lines += ["**System prompt:**", "", _quote(session.system_prompt), ""]
    for message in messages:
        if message.role == "system":
            lines += ["**System:**", "", _quote(message.content), ""]
            continue
        heading = "You" if message.role == "user" else "Assistant"
        about = _about(message.stats) if message.role == "assistant" else ""
        lines += [f"## {heading}{' · ' + about if about else ''}", ""]
        for step in message.tool_steps:  # the tool loop before the answer
            lines += _step_markdown(step)
        if message.reasoning:  # a reasoning model's thinking, quoted before the reply
            lines += ["*Thinking:*", "", _quote(message.reasoning), ""]
        lines += [message.content, ""]
    return "\n".join(lines).rstrip() + "\n"


def write_export(store: ChatStore, session_id: int, path: Path, kind: str | None = None) -> str:
    """Write the chat to ``path`` as ``kind`` ("markdown" or "json"; None: by the suffix,
    .json or anything else as Markdown); returns the kind written."""
    kind = kind or ("json" if Path(path).suffix.lower() == ".json" else "markdown")
    if kind not in ("markdown", "json"):
        raise UserError(f"cannot export as {kind!r}: choose markdown or json")
    text = (
        json.dumps(export_json(store, session_id), indent=2, ensure_ascii=False) + "\n"
        if kind == "json"
        else export_markdown(store, session_id)
    )
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    return kind


def read_export(path: Path) -> dict | list:
    """A JSON chat file's content; UserError when it cannot be read or is not JSON."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise UserError(f"{path} is not a chat: its JSON is nested too deeply") from None
    except ValueError as exc:
        raise UserError(f"{path} is not a JSON chat: {exc}") from None


def import_chat(store: ChatStore, data: object, title: str | None = None) -> Imported:
    """A new chat from an export (or a list of messages), written in one transaction: the
    whole chat, or (a UserError for anything that is not a chat, a failure or Ctrl-C
    part-way) nothing."""
    if isinstance(data, list):
        data = {"messages": data}
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise UserError("not a chat: expected a RadixChat export or a list of messages")
    if json_depth(data) > MAX_DEPTH:
        raise UserError(f"not a chat: nested more than {MAX_DEPTH} levels deep")
    version = data.get("version", VERSION)
    if (
        data.get("format", FORMAT) != FORMAT
        or not isinstance(version, int)
        or isinstance(version, bool)
        or not 1 <= version <= VERSION
    ):
        raise UserError(
            f"not a chat this RadixChat reads: format {short_repr(data.get('format'))}, "
            f"version {short_repr(version)} (it reads {FORMAT!r} version {VERSION})"
        )
    messages = [_checked(i, m) for i, m in enumerate(data["messages"], 1)]
    system = _text_or_none(data.get("system_prompt"), "system_prompt")
    if system is None and messages and messages[0][0] == "system":
        system = messages.pop(0)[1]  # a leading system message is the chat's system prompt
    settings = chat_settings.checked(data.get("settings"))
    name = _text_or_none(title, "title") or _text_or_none(data.get("title"), "title")
    branch_of = _text_or_none(data.get("branch_of"), "branch_of")
    fork_seq = data.get("fork_seq")
    if fork_seq is not None and (not isinstance(fork_seq, int) or isinstance(fork_seq, bool)):
        raise UserError("fork_seq is not a whole number")
    session = store.import_session(
        messages,
        title=name,
        system_prompt=system,
        settings=settings,
        branch=(branch_of, fork_seq) if fork_seq is not None else None,
    )
    return Imported(session, len(messages))


# -- helpers --


def _read(store: ChatStore, session_id: int) -> tuple[Session, list[Message]]:
    session = store.get_session_by_id(session_id)
    if session is None:
        raise UserError(f"no chat with id {session_id}")
    return session, readable(store.messages(session_id))[0]


def _message_json(message: Message) -> dict:
    item = {"role": message.role, "content": message.content}
    if message.reasoning:
        item["reasoning"] = message.reasoning
    stats = dict(message.stats or {})
    for key in TURN_KEYS:
        if key in stats:
            item[key] = stats.pop(key)
    if stats:
        item["stats"] = stats
    if message.tool_steps:  # the tool loop before the answer
        item["tool_steps"] = list(message.tool_steps)
    if message.versions:  # a regenerated reply: every version, and the one chosen
        item["versions"] = [
            {
                key: list(value) if key == "tool_steps" else value
                for key, value in version.items()
                if value is not None and value != ()  # no thinking, no tool loop
            }
            for version in message.versions
        ]
        item["version"] = message.version
    return item


def _step_markdown(step: dict) -> list[str]:
    """One tool step to read: what the model wrote before its calls, then each call (its
    name, its arguments in a code block) and its result (an image as ``[image]``)."""
    lines = [step["content"], ""] if step["content"] else []
    results = {r["id"]: r for r in step["results"]}
    for call in step["tool_calls"]:
        source = f" ({call['server']})" if call.get("server") else ""
        lines += [f"**Tool call:** `{call['name']}`{source}", "", _fenced(call["arguments"]), ""]
        result = results.get(call["id"])
        status = result["status"] if result else "cancelled"
        if result is None or status in ("denied", "cancelled"):
            lines += [f"**Result:** {status}", ""]
            continue
        text = "\n".join(
            part["text"] if part["type"] == "text" else "[image]" for part in result["parts"]
        )
        heading = "**Result:**" if status == "ok" else "**Result (error):**"
        lines += [heading, "", _fenced(text, ""), ""]
    return lines


def _fenced(text: str, language: str = "json") -> str:
    """``text`` in a code block whose fence no run of backticks in it can close."""
    run = current = 0
    for char in text:
        current = current + 1 if char == "`" else 0
        run = max(run, current)
    fence = "`" * max(3, run + 1)
    return f"{fence}{language}\n{text}\n{fence}"


def _about(stats: dict | None) -> str:
    """A reply's model and settings in one line (empty when the store kept none)."""
    stats = stats or {}
    parts = [str(stats["model"])] if stats.get("model") else []
    sampling = stats.get("sampling") if isinstance(stats.get("sampling"), dict) else {}
    parts += [
        f"{RANGES[key].label} {sampling[key]}"
        for key in SAMPLING_KEYS
        if sampling.get(key) is not None
    ]
    return ", ".join(parts)


def _quote(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in text.splitlines())


def _checked(number: int, message: object) -> tuple:
    """(role, content, stats, reasoning, versions, tool_steps) of message ``number``
    (versions: a regenerated reply's, as the store keeps them, or None; tool_steps: a
    reply's tool loop, checked), or a UserError saying what is wrong."""
    if not isinstance(message, dict):
        raise UserError(f"message {number} is not an object with a role and a content")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise UserError(
            f"message {number}: role {short_repr(role)} is not one of {', '.join(ROLES)}"
        )
    if not isinstance(content, str):
        raise UserError(f"message {number}: its content is not text")
    stats = message.get("stats")
    if stats is not None and not isinstance(stats, dict):
        raise UserError(f"message {number}: its stats are not an object")
    stats = dict(stats or {})
    if "model" in message:
        stats["model"] = _text_or_none(message["model"], f"message {number}: its model")
    if "sampling" in message:  # how the reply was made, as a record: never applied
        if message["sampling"] is not None and not isinstance(message["sampling"], dict):
            raise UserError(f"message {number}: its sampling is not an object")
        stats["sampling"] = message["sampling"]
    reasoning = message.get("reasoning") if role == "assistant" else None
    if reasoning is not None and not isinstance(reasoning, str):
        raise UserError(f"message {number}: its reasoning is not text")
    versions = _checked_versions(number, message) if role == "assistant" else None
    steps = _checked_steps(number, message.get("tool_steps")) if role == "assistant" else ()
    return (
        role,
        content,
        (stats or None) if role == "assistant" else None,
        reasoning or None,
        versions,
        steps,
    )


def _checked_steps(number: int, steps: object, what: str = "") -> tuple[dict, ...]:
    try:
        return tool_steps.checked(steps)
    except tool_steps.StepError as exc:
        raise UserError(f"message {number}{what}: {exc}") from None


def _checked_versions(number: int, message: dict) -> dict | None:
    """A reply's versions from an export, as the store keeps them ({"chosen", "replies"})."""
    versions = message.get("versions")
    if versions is None:
        return None
    if not isinstance(versions, list) or not all(
        isinstance(v, dict) and isinstance(v.get("content"), str) for v in versions
    ):
        raise UserError(f"message {number}: its versions are not a list of replies")
    chosen = message.get("version", len(versions) - 1)
    if not isinstance(chosen, int) or isinstance(chosen, bool) or not 0 <= chosen < len(versions):
        raise UserError(f"message {number}: its version is not one of its versions")
    replies = []
    for version in versions:
        stats, reasoning = version.get("stats"), version.get("reasoning")
        if stats is not None and not isinstance(stats, dict):
            raise UserError(f"message {number}: a version's stats are not an object")
        if reasoning is not None and not isinstance(reasoning, str):
            raise UserError(f"message {number}: a version's reasoning is not text")
        steps = _checked_steps(number, version.get("tool_steps"), ", a version")
        replies.append(
            {
                "content": version["content"],
                "stats": stats,
                "reasoning": reasoning,
                "tool_steps": list(steps),
            }
        )
    return {"chosen": chosen, "replies": replies}


def _text_or_none(value: object, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise UserError(f"{what} is not text")
    return value
