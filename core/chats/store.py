"""Chat sessions and their messages, kept in SQLite (``chats.db``).

One :class:`ChatStore` wraps one connection. Use it from one thread at a time; a
thread that needs the store concurrently opens its own. Every write runs in one
``BEGIN IMMEDIATE`` transaction, so a crash never leaves half of a change behind,
and every database failure the user can act on (not a database, written by a newer
version, locked, disk full) surfaces as :class:`~core.errors.StoreError`.

A damaged row never stops a read: text that is not UTF-8 reads back with U+FFFD, a
settings or stats value that is not a JSON object reads as empty, and the row's
``damaged`` says what was wrong (:mod:`core.chats.rows` reads them; :func:`readable` sums
it up in one line for a chat; :meth:`ChatStore.verify` lists every damaged row).

A reply that used tools keeps its tool loop beside its final answer (``tool_steps``, as
:mod:`core.chats.tool_steps` describes them): stored with it, kept with each of its
versions when it is regenerated, copied into a branch.
"""

from __future__ import annotations

import json
import time
import unicodedata
from pathlib import Path
from typing import Any

from core.chats import tool_steps as steps_json
from core.chats.records import ROLES, Damage, Message, Session, readable  # noqa: F401  (its API)
from core.chats.rows import message as _message
from core.chats.rows import session as _session
from core.chats.rows import text as _text
from core.chats.rows import version as _version
from core.chats.schema import MIGRATIONS, SCHEMA_VERSION  # noqa: F401  (its API too)
from core.errors import StoreError
from kvcache.sqlite_file import SqliteFile

TITLE_CHARS = 60
BRANCH_MARK = "↳ "  # a branch's title: the chat it came from's, after this
MAX_NAME_CHARS = 256  # a session name, as the API allows it
_UNSET: Any = object()  # "argument not given", for update_session


class ChatStore(SqliteFile):
    """The chat database at ``path``, created and migrated on open."""

    error = StoreError
    migrations = MIGRATIONS
    wordings = {
        "newer": (
            "{path} was written by a newer RadixChat (schema {version}, this version "
            "knows {known}); upgrade RadixChat or use another --data-dir"
        ),
        "foreign": (
            "{path} is a SQLite database but not a RadixChat chat database; "
            "move it aside or use another --data-dir"
        ),
        "locked": (
            "{path} is locked by another RadixChat process; close it or use another --data-dir"
        ),
        "full": "the disk is full: cannot write {path} (nothing was changed); free some space",
        "corrupt": (
            "{path} is not a readable chat database ({text}); move it aside or use another "
            "--data-dir"
        ),
        "io": "cannot use {path}: {text}",
    }

    def __init__(self, path: Path, *, timeout: float = 2.0):
        self.path = Path(path)
        self._connect(timeout, self._setup)

    def _setup(self) -> None:
        self.db.conn.text_factory = _text  # a bad byte reads back marked, instead of raising
        self.db.enable_wal()
        self.db.execute("PRAGMA foreign_keys = ON")

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    def __enter__(self) -> ChatStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sessions --

    def create_session(
        self,
        name: str | None = None,
        *,
        system_prompt: str | None = None,
        model: str | None = None,
        settings: dict | None = None,
    ) -> Session:
        """A new session; ``name=None`` generates a unique one from the clock."""
        if name is not None:
            check_name(name)
        with self._transaction():
            if name is None:
                name = self._unused_name(time.strftime("chat-%Y%m%d-%H%M%S"))
            elif self._rows("SELECT 1 FROM sessions WHERE name = ?", [name]):
                raise StoreError(f"a chat named {name!r} already exists")
            now = self._now()
            session_id = (
                self.db["sessions"]
                .insert(
                    {
                        "name": name,
                        "title": None,
                        "system_prompt": system_prompt,
                        "model": model,
                        "settings": _dumps(settings),
                        "created_at": now,
                        "updated_at": now,
                    }
                )
                .last_pk
            )
        return self.get_session_by_id(session_id)

    def get_session(self, name: str) -> Session | None:
        check_name(name)
        rows = self._rows("SELECT * FROM sessions WHERE name = ?", [name])
        return _session(rows[0]) if rows else None

    def get_session_by_id(self, session_id: int) -> Session | None:
        rows = self._rows("SELECT * FROM sessions WHERE id = ?", [session_id])
        return _session(rows[0]) if rows else None

    def get_or_create_session(self, name: str, **kw: Any) -> Session:
        """The session called ``name``; created with ``kw`` if there is none."""
        found = self.get_session(name)
        if found is not None:
            return found
        try:
            return self.create_session(name, **kw)
        except StoreError:  # another process created it in between
            found = self.get_session(name)
            if found is None:
                raise
            return found

    def list_sessions(self) -> list[Session]:
        """All sessions, most recently updated first."""
        rows = self._rows("SELECT * FROM sessions ORDER BY updated_at DESC, id DESC")
        return [_session(row) for row in rows]

    def rename_session(self, session_id: int, title: str) -> None:
        """Set the display title (an empty one clears it; the name never changes)."""
        with self._transaction():
            self._touch(session_id, title=title.strip() or None)

    def update_session(
        self,
        session_id: int,
        *,
        system_prompt: str | None = _UNSET,
        model: str | None = _UNSET,
        settings: dict | None = _UNSET,
    ) -> None:
        """Change only the fields given; ``settings`` replaces the whole dict."""
        changes = {"system_prompt": system_prompt, "model": model}
        changes = {key: value for key, value in changes.items() if value is not _UNSET}
        if settings is not _UNSET:
            changes["settings"] = _dumps(settings)
        with self._transaction():
            self._touch(session_id, **changes)

    def delete_session(self, session_id: int) -> None:
        """Delete a session and its messages (no error if it is already gone)."""
        with self._transaction():
            self.db.execute("DELETE FROM sessions WHERE id = ?", [session_id])

    def search(self, query: str) -> list[Session]:
        """Sessions whose name, title or any message contains ``query`` (ASCII case-insensitive)."""
        if not query.strip():
            return self.list_sessions()
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        like = "LIKE :p ESCAPE '\\'"
        rows = self._rows(
            f"""SELECT * FROM sessions AS s
                WHERE s.name {like} OR s.title {like} OR EXISTS (
                    SELECT 1 FROM messages AS m WHERE m.session_id = s.id AND m.content {like})
                ORDER BY updated_at DESC, id DESC""",
            {"p": pattern},
        )
        return [_session(row) for row in rows]

    # -- messages --

    def add_message(
        self,
        session_id: int,
        role: str,
        content: str,
        stats: dict | None = None,
        reasoning: str | None = None,
        tool_steps: tuple[dict, ...] = (),
    ) -> Message:
        """Append one message (a reply with its ``tool_steps``, if it used tools); the first
        user message also titles an untitled session."""
        with self._transaction():
            message_id = self._insert_message(
                session_id, role, content, stats, reasoning, tool_steps
            )
        return self._message(message_id)

    def add_turn(
        self,
        session_id: int,
        user_content: str,
        assistant_content: str,
        stats: dict | None = None,
        reasoning: str | None = None,
        tool_steps: tuple[dict, ...] = (),
    ) -> tuple[Message, Message]:
        """Append a user message and its reply (with its ``reasoning``, the thinking of a
        reasoning model, and its ``tool_steps``, the tool loop before its final answer)
        together: both rows or neither. Steps that are not steps: StepError (a ValueError)."""
        with self._transaction():
            user_id = self._insert_message(session_id, "user", user_content, None)
            reply_id = self._insert_message(
                session_id, "assistant", assistant_content, stats, reasoning, tool_steps
            )
        return self._message(user_id), self._message(reply_id)

    def replace_last_turn(
        self,
        session_id: int,
        user_content: str,
        assistant_content: str,
        stats: dict | None = None,
        reasoning: str | None = None,
        tool_steps: tuple[dict, ...] = (),
    ) -> tuple[Message, Message]:
        """Replace the session's last turn (its last user message and what follows it)
        with a new one, in one transaction: a regenerated or edited turn, or nothing changes.
        A session with no user message yet gets the turn appended. A regenerated reply (the
        same user message) keeps the replies it replaces as its earlier versions (each
        with its tool steps)."""
        tool_steps = steps_json.checked(tool_steps)
        with self._transaction():
            rows = self._rows(
                "SELECT max(seq) AS seq FROM messages WHERE session_id = ? AND role = 'user'",
                [session_id],
            )
            earlier: list[dict] = []
            if rows[0]["seq"] is not None:
                old = [
                    _message(row)
                    for row in self._rows(
                        "SELECT * FROM messages WHERE session_id = ? AND seq >= ? ORDER BY seq",
                        [session_id, rows[0]["seq"]],
                    )
                ]
                if old[0].content == user_content and len(old) > 1 and old[1].role == "assistant":
                    reply = old[1]
                    earlier = list(reply.versions) or [_version(reply)]
                self.db.execute(
                    "DELETE FROM messages WHERE session_id = ? AND seq >= ?",
                    [session_id, rows[0]["seq"]],
                )
            user_id = self._insert_message(session_id, "user", user_content, None)
            reply_id = self._insert_message(
                session_id, "assistant", assistant_content, stats, reasoning, tool_steps
            )
            if earlier:
                replies = [
                    *earlier,
                    {
                        "content": assistant_content,
                        "stats": stats,
                        "reasoning": reasoning or None,
                        "tool_steps": list(tool_steps),
                    },
                ]
                self.db.execute(
                    "UPDATE messages SET versions = ? WHERE id = ?",
                    [_dumps({"chosen": len(replies) - 1, "replies": replies}), reply_id],
                )
        return self._message(user_id), self._message(reply_id)

    def delete_last_message(self, session_id: int) -> Message | None:
        """Remove the session's last message (to regenerate a reply); returns it."""
        with self._transaction():
            rows = self._rows(
                "SELECT * FROM messages WHERE session_id = ? ORDER BY seq DESC LIMIT 1",
                [session_id],
            )
            if not rows:
                return None
            self.db.execute("DELETE FROM messages WHERE id = ?", [rows[0]["id"]])
            self._touch(session_id)
        return _message(rows[0])

    def branch_session(self, session_id: int, upto_seq: int) -> Session:
        """A new chat holding the first ``upto_seq`` messages of ``session_id`` (its system
        prompt, settings and model too), marked as its branch: a history shared with the
        chat it came from, which the KV cache holds already (its prefix is a cache hit)."""
        with self._transaction():
            rows = self._rows("SELECT * FROM sessions WHERE id = ?", [session_id])
            if not rows:
                raise StoreError(f"there is no chat session with id {session_id}")
            parent = rows[0]
            now = self._now()
            title = parent["title"] or "New chat"
            branch_id = (
                self.db["sessions"]
                .insert(
                    {
                        "name": self._unused_name(f"{parent['name']}-branch"[: MAX_NAME_CHARS - 8]),
                        "title": title if title.startswith(BRANCH_MARK) else BRANCH_MARK + title,
                        "system_prompt": parent["system_prompt"],
                        "model": parent["model"],
                        "settings": parent["settings"],
                        "created_at": now,
                        "updated_at": now,
                        "parent_id": session_id,
                        "fork_seq": upto_seq,
                    }
                )
                .last_pk
            )
            self.db.execute(
                "INSERT INTO messages (session_id, seq, role, content, stats, created_at, "
                "reasoning, versions, tool_steps) SELECT ?, seq, role, content, stats, "
                "created_at, reasoning, versions, tool_steps FROM messages "
                "WHERE session_id = ? AND seq <= ? ORDER BY seq",
                [branch_id, session_id, upto_seq],
            )
        return self.get_session_by_id(branch_id)

    def select_version(self, message_id: int, index: int) -> Message:
        """Make version ``index`` of a regenerated reply the one the chat goes on from."""
        with self._transaction():
            rows = self._rows("SELECT * FROM messages WHERE id = ?", [message_id])
            if not rows:
                raise StoreError(f"there is no message with id {message_id}")
            message = _message(rows[0])
            if not 0 <= index < len(message.versions):
                raise StoreError(f"that reply has no version {index + 1}")
            chosen = message.versions[index]
            self.db.execute(
                "UPDATE messages SET content = ?, stats = ?, reasoning = ?, versions = ?, "
                "tool_steps = ? WHERE id = ?",
                [
                    chosen.get("content", ""),
                    _dumps(chosen.get("stats")),
                    chosen.get("reasoning") or None,
                    _dumps({"chosen": index, "replies": list(message.versions)}),
                    steps_json.to_json(tuple(chosen.get("tool_steps", ()))),
                    message_id,
                ],
            )
            self._touch(message.session_id)
        return self._message(message_id)

    def import_session(
        self,
        messages: list[tuple],
        *,
        title: str | None = None,
        system_prompt: str | None = None,
        settings: dict | None = None,
        branch: tuple[str | None, int] | None = None,
    ) -> Session:
        """A new session holding ``messages`` (``(role, content, stats, reasoning)``, then
        where it has them a reply's versions as a fifth, as the store keeps them, and its
        tool steps as a sixth), titled ``title`` (else by its first user message), in one
        transaction: the whole chat or nothing, whatever stops it part-way (a bad message,
        a full disk, Ctrl-C, a crash). ``branch``: the chat it is a branch of (its name:
        linked where this store has it) and its fork point."""
        messages = [(*m, None, ())[:6] if len(m) < 6 else tuple(m) for m in messages]
        for number, (role, content, _, reasoning, _versions, steps) in enumerate(messages, 1):
            if role not in ROLES:
                raise ValueError(f"role must be one of {ROLES}, not {role!r}")
            stored = steps_json.to_json(steps_json.checked(steps)) or ""
            if not all(_is_text(t) for t in (content, reasoning or "", stored)):
                raise StoreError(f"message {number} is not valid UTF-8 text: nothing was saved")
        for text in (title, system_prompt):
            if text is not None and not _is_text(text):
                raise StoreError("a title or system prompt that is not valid UTF-8 text")
        first_user = next((m[1] for m in messages if m[0] == "user"), "")
        parent_name, fork_seq = branch if branch is not None else (None, None)
        with self._transaction():
            parent = (
                self._rows("SELECT id FROM sessions WHERE name = ?", [parent_name])
                if parent_name
                else []
            )
            name = self._unused_name(time.strftime("chat-%Y%m%d-%H%M%S"))
            now = self._now()
            session_id = (
                self.db["sessions"]
                .insert(
                    {
                        "name": name,
                        "title": (title or "").strip() or _title_from(first_user),
                        "system_prompt": system_prompt,
                        "model": None,
                        "settings": _dumps(settings),
                        "created_at": now,
                        "updated_at": now,
                        "parent_id": parent[0]["id"] if parent else None,
                        "fork_seq": fork_seq,
                    }
                )
                .last_pk
            )
            self.db["messages"].insert_all(
                {
                    "session_id": session_id,
                    "seq": seq,
                    "role": role,
                    "content": content,
                    "stats": _dumps(stats),
                    "created_at": now,
                    "reasoning": reasoning or None,
                    "versions": _dumps(versions),
                    "tool_steps": steps_json.to_json(steps_json.checked(steps)),
                }
                for seq, (role, content, stats, reasoning, versions, steps) in enumerate(
                    messages, 1
                )
            )
        return self.get_session_by_id(session_id)

    def messages(self, session_id: int) -> list[Message]:
        rows = self._rows("SELECT * FROM messages WHERE session_id = ? ORDER BY seq", [session_id])
        return [_message(row) for row in rows]

    # -- checking --

    def verify(self) -> list[Damage]:
        """Every row that does not read back whole: text that is not UTF-8, a settings or
        stats value that is not JSON, a role that is none of ROLES; and what SQLite's own
        ``integrity_check`` finds. Reads only."""
        damage: list[Damage] = []
        with self._read():
            problems = [row[0] for row in self.db.execute("PRAGMA integrity_check").fetchall()]
            names = {}
            for row in self.db.query("SELECT * FROM sessions ORDER BY id"):
                session = _session(row)
                names[session.id] = session.name
                if session.damaged:
                    damage.append(Damage(session.id, session.name, None, session.damaged))
            for row in self.db.query("SELECT * FROM messages ORDER BY session_id, seq"):
                message = _message(row)
                if message.damaged:
                    damage.append(
                        Damage(
                            message.session_id,
                            names.get(message.session_id, "?"),
                            message.seq,
                            message.damaged,
                        )
                    )
        if problems != ["ok"]:
            damage.extend(Damage(0, "", None, f"SQLite integrity check: {p}") for p in problems)
        return damage

    # -- internals --

    def _insert_message(
        self,
        session_id: int,
        role: str,
        content: str,
        stats: dict | None,
        reasoning: str | None = None,
        tool_steps: tuple[dict, ...] = (),
    ) -> int:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        steps = steps_json.to_json(steps_json.checked(tool_steps))
        if not all(_is_text(t) for t in (content, reasoning or "", steps or "")):
            raise StoreError("a message that is not valid UTF-8 text cannot be saved")
        session = self._rows("SELECT title FROM sessions WHERE id = ?", [session_id])
        if not session:
            raise StoreError(f"there is no chat session with id {session_id}")
        seq = self._rows(
            "SELECT coalesce(max(seq), 0) + 1 AS seq FROM messages WHERE session_id = ?",
            [session_id],
        )[0]["seq"]
        now = self._now()
        message_id = (
            self.db["messages"]
            .insert(
                {
                    "session_id": session_id,
                    "seq": seq,
                    "role": role,
                    "content": content,
                    "stats": _dumps(stats),
                    "created_at": now,
                    "reasoning": reasoning or None,
                    "tool_steps": steps,
                }
            )
            .last_pk
        )
        title = session[0]["title"] or (_title_from(content) if role == "user" else None)
        self._touch(session_id, title=title, now=now)
        return message_id

    def _touch(self, session_id: int, now: float | None = None, **changes: Any) -> None:
        """Apply ``changes`` to a session and bump its ``updated_at``."""
        changes["updated_at"] = self._now() if now is None else now
        assignments = ", ".join(f"{column} = :{column}" for column in changes)
        cursor = self.db.execute(
            f"UPDATE sessions SET {assignments} WHERE id = :session_id",
            {**changes, "session_id": session_id},
        )
        if cursor.rowcount == 0:
            raise StoreError(f"there is no chat session with id {session_id}")

    def _now(self) -> float:
        """The wall clock, but always after the latest ``updated_at``, so that
        "most recently updated first" is exact even when the clock is coarse."""
        rows = self._rows(
            "SELECT max(:now, coalesce(max(updated_at), 0) + 1e-6) AS now FROM sessions",
            {"now": time.time()},
        )
        return rows[0]["now"]

    def _unused_name(self, base: str) -> str:
        taken = {
            row["name"]
            for row in self._rows(
                "SELECT name FROM sessions WHERE name = :b OR name LIKE :b || '-%'", {"b": base}
            )
        }
        name, n = base, 2
        while name in taken:
            name, n = f"{base}-{n}", n + 1
        return name

    def _message(self, message_id: int) -> Message:
        return _message(self._rows("SELECT * FROM messages WHERE id = ?", [message_id])[0])

    def _rows(self, sql: str, params: Any = None) -> list[dict]:
        with self._errors():
            return list(self.db.query(sql, params))


def check_name(name: str) -> None:
    """Refuse, with one line, a session name that could not be stored or shown safely:
    empty, longer than MAX_NAME_CHARS, not valid UTF-8 (a lone surrogate, or bytes from
    the command line that were not UTF-8), or holding control characters."""
    if not name.strip():
        raise StoreError("a chat name cannot be empty")
    if len(name) > MAX_NAME_CHARS:
        raise StoreError(
            f"a chat name can have at most {MAX_NAME_CHARS} characters, not {len(name)}"
        )
    if not _is_text(name):
        raise StoreError("a chat name must be valid UTF-8 text")
    if any(unicodedata.category(c) == "Cc" for c in name):
        raise StoreError("a chat name cannot contain control characters")


def _is_text(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _title_from(content: str) -> str | None:
    """The first non-blank line, cut to TITLE_CHARS."""
    line = next((line.strip() for line in content.splitlines() if line.strip()), "")
    if len(line) > TITLE_CHARS:
        line = line[: TITLE_CHARS - 1].rstrip() + "…"
    return line or None


def _dumps(value: dict | None) -> str | None:
    return None if value is None else json.dumps(value)
