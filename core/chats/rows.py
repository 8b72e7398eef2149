"""The chat database's rows read back as :class:`~core.chats.records.Session` and
:class:`~core.chats.records.Message` values, whatever damage they carry.

A damaged row never stops a read: text that is not UTF-8 reads back with U+FFFD (the
connection's ``text_factory`` is :func:`text`), a settings or stats value that is not a JSON
object reads as empty, tool steps that are not steps read as none, and the value's
``damaged`` says what was wrong.
"""

from __future__ import annotations

import json

from core.chats import tool_steps
from core.chats.records import ROLES, Message, Session


class DamagedText(str):
    """A TEXT value that was not valid UTF-8, its bad bytes read as U+FFFD."""


def text(raw: bytes) -> str:
    """A TEXT value's bytes as a str (the connection's ``text_factory``)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return DamagedText(raw.decode("utf-8", "replace"))


def session(row: dict) -> Session:
    problems: list[str] = []
    _damage(row, ("name", "title", "system_prompt", "model", "settings"), problems)
    settings = _loads(row["settings"], problems, "settings") or {}
    return Session(**{**row, "settings": settings, "damaged": "; ".join(problems) or None})


def message(row: dict) -> Message:
    problems: list[str] = []
    _damage(row, ("role", "content", "stats", "reasoning", "versions", "tool_steps"), problems)
    stats = _loads(row["stats"], problems, "stats")
    if row["role"] not in ROLES:
        problems.append(f"its role {row['role']!r} is none of {', '.join(ROLES)}")
    versions, chosen = _versions(_loads(row.get("versions"), problems, "versions"), problems)
    return Message(
        **{
            **row,
            "stats": stats,
            "versions": versions,
            "version": chosen,
            "tool_steps": _steps(row["tool_steps"], problems),
            "damaged": "; ".join(problems) or None,
        }
    )


def version(message: Message) -> dict:
    """A reply as one of its versions."""
    return {
        "content": message.content,
        "stats": message.stats,
        "reasoning": message.reasoning,
        "tool_steps": list(message.tool_steps),
    }


def _steps(value: str | None, problems: list[str], what: str = "its tool steps") -> tuple:
    """Stored tool steps (JSON text), or () with the problem noted when they are not steps."""
    if isinstance(value, DamagedText):
        return ()  # _damage noted it
    try:
        return tool_steps.from_json(value)
    except tool_steps.StepError as exc:
        problems.append(f"{what} do not read back ({exc})")
        return ()


def _loads(value: str | None, problems: list[str], what: str) -> dict | None:
    """A stored JSON object, or None (the problem noted) when it does not read back as one."""
    if not value or isinstance(value, DamagedText):
        return None
    try:
        loaded = json.loads(value)
    except ValueError:
        loaded = None
    if not isinstance(loaded, dict):
        problems.append(f"{what} are not a JSON object")
        return None
    return dict(loaded)


def _damage(row: dict, columns: tuple[str, ...], problems: list[str]) -> None:
    """Note the text columns that did not read back as text (and make them text)."""
    for column in columns:
        value = row[column]
        if isinstance(value, bytes):  # a changed type byte: the value reads back as a blob
            row[column] = value = DamagedText(text(value))
        elif value is not None and not isinstance(value, str):
            row[column] = value = DamagedText(value)
        if isinstance(value, DamagedText):
            problems.append(f"{column} is not valid UTF-8")


def _versions(value: dict | None, problems: list[str]) -> tuple[tuple[dict, ...], int]:
    """A reply's versions as stored (JSON read back): the well-formed ones and the chosen."""
    if not isinstance(value, dict) or not isinstance(value.get("replies"), list):
        return (), 0
    replies = tuple(
        {
            "content": r["content"],
            "stats": r.get("stats") if isinstance(r.get("stats"), dict) else None,
            "reasoning": r.get("reasoning") if isinstance(r.get("reasoning"), str) else None,
            "tool_steps": _version_steps(r.get("tool_steps"), number, problems),
        }
        for number, r in enumerate(value["replies"], 1)
        if isinstance(r, dict) and isinstance(r.get("content"), str)
    )
    chosen = value.get("chosen")
    if len(replies) < 2:
        return (), 0
    return replies, chosen if isinstance(chosen, int) and 0 <= chosen < len(replies) else 0


def _version_steps(value: object, number: int, problems: list[str]) -> tuple[dict, ...]:
    try:
        return tool_steps.checked(value)
    except tool_steps.StepError as exc:
        problems.append(f"the tool steps of its version {number} do not read back ({exc})")
        return ()
