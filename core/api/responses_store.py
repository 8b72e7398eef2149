"""Stored responses and conversations of the Responses API, kept in SQLite
(``responses.db``, beside ``chats.db`` in the data folder), so ``previous_response_id`` and
``conversation`` work after a restart.

Everything stored belongs to the cache namespace's owner (an API key's, never the key):
another key's requests cannot read, continue or delete it. A response is stored as a link
to the response it continues plus its own items (:mod:`core.api.responses_tables`); a
conversation as its items in order. A continuation of either renders to a prompt that
extends the previous one, so its prefix is a cache hit.

The store holds what its :class:`~core.api.responses_room.StoreBudget` allows, in UTF-8
bytes: a share per API key (one key's writes evict only its own least recently used
responses and conversations), a total, and the disk's reserve (what the chat history
needs). Deleting a response that others continue hides it (a 404 for its owner too) and
keeps its row for them, counted in the key's share, until the last of them goes.

A damaged file (a database that cannot be read, or that is not this store) is set aside
as ``responses.db.damaged-N`` and a new one started, as the KV cache's is. One connection,
opened on first use; every call takes the store's lock (the API calls it from worker
threads, never the event loop).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from core import paths
from core.api.responses_room import Refusal, StoreBudget, make_room, owner_bytes, total_bytes
from core.api.responses_tables import (
    CHAIN,
    MIGRATIONS,
    ROW_BYTES,
    chain_ids,
    drop_conversation,
    drop_response,
    dump,
    has_dependants,
    touch_chain,
    utf8_bytes,
)
from core.errors import StoreError
from kvcache.sqlite_file import SqliteFile, disk_room, set_aside

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_BUDGET_BYTES = paths.STORED_RESPONSES_MAX
WAL_LIMIT_BYTES = 4 * 2**20  # the write-ahead log is cut back to this after a large write


class Missing(LookupError):
    """No such response, conversation or item of this owner's (the message says which)."""


@dataclass(frozen=True)
class Turn:
    """One finished response to keep: its object (None: not stored, ``store: false``), the
    input items it added and its output items; the response it continues, or the
    conversation it was made in (which gets its input and output items)."""

    response: dict[str, Any] | None
    input: list[dict[str, Any]]
    output: list[dict[str, Any]]
    previous: str | None = None
    conversation: str | None = None


@dataclass(frozen=True)
class Saved:
    """What a write did: stored, or not and why (``refusal``)."""

    refusal: Refusal | None = None

    @property
    def stored(self) -> bool:
        return self.refusal is None


@dataclass(frozen=True)
class History:
    """The items a continuation extends (every input and output item, oldest first) and the
    bytes they hold in the store; ``conversation``: the response was made in that
    conversation (continue it there: it has no chain of its own)."""

    items: tuple[dict[str, Any], ...]
    bytes: int
    conversation: str | None = None


@dataclass(frozen=True)
class ItemPage:
    items: list[dict[str, Any]]
    has_more: bool


@dataclass(frozen=True)
class Cleared:
    responses: int
    conversations: int
    bytes: int


class _NoRoom(Exception):
    """A write found no room: its transaction rolls back."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.message)
        self.refusal = refusal


class ResponseStore(SqliteFile):
    """The stored responses and conversations at ``path`` (created, and migrated, on first
    use), within ``budget``."""

    error = StoreError
    migrations = MIGRATIONS
    wordings = {
        "newer": (
            "{path} was written by a newer RadixChat (schema {version}, this version "
            "knows {known}); upgrade RadixChat or use another --data-dir"
        ),
        "foreign": "{path} is a SQLite database but not RadixChat's stored responses",
        "locked": "{path} is locked by another RadixChat process",
        "full": "the disk is full: cannot write {path}",
        "corrupt": "{path} is not a readable database of stored responses ({text})",
        "io": "cannot use {path}: {text}",
    }

    def __init__(self, path: Path, budget: StoreBudget | None = None):
        self.path = Path(path)
        self.budget = budget or StoreBudget(DEFAULT_BUDGET_BYTES)
        self._lock = threading.Lock()

    # ------------------------------------------------------------ the file
    def _open(self) -> None:
        if self.db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._connect(2.0, self._setup)
            self._fit()

    def _fit(self) -> None:
        """Hold what is stored to the budget (it may have been lowered, or the file written
        by an older version): each owner to its share, then the total."""
        owners = [
            row[0]
            for row in self.db.execute(
                "SELECT owner FROM responses UNION SELECT owner FROM conversations"
            )
        ]
        if total_bytes(self.db) <= self.budget.total_bytes and all(
            owner_bytes(self.db, owner) <= self.budget.owner_bytes for owner in owners
        ):
            return
        with self._transaction():
            for owner in owners:
                make_room(self.db, self.budget, owner, 0, set(), disk_room=2**62)

    def _setup(self) -> None:
        if self._user_version() == 0 and not self.db.table_names():
            # a new file: evicted rows give their pages back to the disk (incremental_vacuum)
            self.db.execute("PRAGMA auto_vacuum = INCREMENTAL")
        self.db.enable_wal()
        self.db.execute("PRAGMA synchronous = NORMAL")
        self.db.execute("PRAGMA secure_delete = FAST")  # a delete writes no zeroes
        self.db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    def _guarded(self, work: Callable[[], T]) -> T:
        """``work()`` on the open store. A file that turns out damaged (cut short, not a
        database, not this store) is set aside and ``work`` runs again on a new one."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    self._open()
                    return work()
                except StoreError as exc:
                    if attempt == 2 or getattr(exc, "reason", None) not in ("corrupt", "foreign"):
                        raise
                    self._set_aside(exc)
        raise AssertionError("unreachable")

    def _set_aside(self, exc: StoreError) -> None:
        self._close()
        try:
            aside = set_aside(self.path)
        except OSError as rename_error:
            raise StoreError(f"{exc}; it could not be set aside: {rename_error}") from exc
        log.warning("%s; set aside as %s, starting a new store of responses", exc, aside.name)

    def _write(self, work: Callable[[], T]) -> T:
        """``work()`` in one write transaction, then the write-ahead log folded back (and,
        in a file made by this version, freed pages given back to the disk)."""

        def run() -> T:
            with self._transaction():
                done = work()
            try:
                self.db.execute("PRAGMA incremental_vacuum").fetchall()
                self.db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except Exception as exc:  # a busy reader: retried after the next write
                log.debug("checkpoint skipped: %s", exc)
            return done

        return self._guarded(run)

    def _reading(self, work: Callable[[], T]) -> T:
        """``work()`` in one read transaction (a consistent snapshot)."""

        def run() -> T:
            with self._read():
                return work()

        return self._guarded(run)

    def _room(self, owner: str, need: int, keep: set[str]) -> None:
        """Make room for ``owner``'s ``need`` bytes, or raise :class:`_NoRoom` (the write
        transaction rolls back)."""
        try:
            room = disk_room(self.path, self.budget.reserve_bytes)
        except OSError as exc:
            raise StoreError(f"cannot see the free space beside {self.path}: {exc}") from exc
        refusal = make_room(self.db, self.budget, owner, need, keep, room)
        if refusal is not None:
            raise _NoRoom(refusal)

    def _too_large(self, size: int, what: str) -> None:
        if size > self.budget.item_bytes:
            raise _NoRoom(
                Refusal(
                    "item",
                    f"{what} is {size:,} bytes; one stored response or item may take "
                    f"{self.budget.item_bytes:,}",
                )
            )

    # ------------------------------------------------------------ responses
    def put(self, owner: str, turn: Turn) -> Saved:
        """Keep ``turn`` for ``owner``: its response (when it has one) and, in a
        conversation, its input and output items. All of it or nothing."""

        def work() -> None:
            now = time.time()
            keep: set[str] = set()
            need = 0
            items: list[tuple[str, str, int]] = []
            if turn.conversation is not None:
                self._owned_conversation(turn.conversation, owner)
                keep.add(turn.conversation)
                items = self._item_rows([*turn.input, *turn.output])
                need += sum(size for _, _, size in items)
            row = None
            if turn.response is not None:
                row = self._response_row(owner, turn, now)
                self._too_large(row["bytes"], "the response with its input")
                need += row["bytes"]
                if turn.previous is not None:
                    chain = chain_ids(self.db, turn.previous)
                    if turn.previous not in chain:  # deleted while this response was made
                        raise Missing(f"no stored response '{turn.previous}'")
                    keep |= chain
            self._room(owner, need, keep)
            if items:
                self._append(turn.conversation, items, now)
            if row is not None:
                self.db["responses"].insert(row, replace=True)
                touch_chain(self.db, row["id"], now)

        try:
            self._write(work)
        except _NoRoom as no_room:
            return Saved(no_room.refusal)
        except Missing as missing:
            return Saved(Refusal("gone", str(missing)))
        return Saved()

    @staticmethod
    def _response_row(owner: str, turn: Turn, now: float) -> dict[str, Any]:
        response = {**turn.response, "output": None}  # kept once, in its own column
        row = {
            "id": turn.response["id"],
            "owner": owner,
            "created_at": now,
            "last_used": now,
            "previous": turn.previous,
            "conversation": turn.conversation,
            "hidden": 0,
            # in a conversation, its items are the conversation's
            "input": dump([] if turn.conversation is not None else turn.input),
            "response": dump(response),
            "output": dump(turn.output),
        }
        row["bytes"] = ROW_BYTES + sum(utf8_bytes(row[k]) for k in ("input", "response", "output"))
        return row

    def get(self, response_id: str, owner: str) -> dict[str, Any] | None:
        """The response object ``response_id`` of ``owner``'s, as it was answered (None:
        no such response of theirs, or deleted)."""

        def work():
            return self.db.execute(
                "SELECT response, output FROM responses WHERE id = ? AND owner = ? AND hidden = 0",
                [response_id, owner],
            ).fetchone()

        found = self._reading(work)
        if found is None:
            return None
        return _response(found[0], found[1])

    def history(self, response_id: str, owner: str) -> History | None:
        """What a continuation of ``owner``'s response ``response_id`` extends: the chain
        read back from its first response, each response's input then its output (None: no
        such response of theirs, or deleted)."""

        def work():
            if not self._visible(response_id, owner):
                return None
            return self.db.execute(
                f"{CHAIN} SELECT r.input, r.output, r.conversation, r.bytes, r.previous "
                "FROM chain JOIN responses r USING (id) ORDER BY chain.depth DESC",
                [response_id],
            ).fetchall()

        rows = self._reading(work)
        if rows is None:
            return None
        if rows[-1][2] is not None:  # made in a conversation: no chain of its own
            return History((), 0, rows[-1][2])
        if rows[0][4] is not None:  # a link lost: the invariant says this cannot be
            log.error("stored response %s: its chain is broken at %s", response_id, rows[0][4])
            return None
        items: list[dict[str, Any]] = []
        for input_json, output_json, _conv, _size, _prev in rows:
            items += _loads(input_json) + _loads(output_json)
        return History(tuple(items), sum(row[3] for row in rows))

    def delete(self, response_id: str, owner: str) -> bool:
        """Delete ``owner``'s response ``response_id``; whether there was one. A response
        other stored responses continue is hidden instead, its row kept for them."""

        def work() -> bool:
            if not self._visible(response_id, owner):
                return False
            if has_dependants(self.db, response_id):
                self.db.execute("UPDATE responses SET hidden = 1 WHERE id = ?", [response_id])
            else:
                drop_response(self.db, response_id)
            return True

        return self._write(work)

    def _visible(self, response_id: str, owner: str) -> bool:
        return (
            self.db.execute(
                "SELECT 1 FROM responses WHERE id = ? AND owner = ? AND hidden = 0",
                [response_id, owner],
            ).fetchone()
            is not None
        )

    # ------------------------------------------------------------ conversations
    def create_conversation(
        self, owner: str, metadata: dict[str, str], items: list[dict[str, Any]]
    ) -> dict[str, Any] | Refusal:
        """A new conversation of ``owner``'s holding ``items`` (each with its ``id``): its
        object, or why it could not be stored."""
        conversation_id = f"conv_{uuid.uuid4().hex}"

        def work() -> dict[str, Any]:
            now = time.time()
            head = dump(metadata)
            rows = self._item_rows(items)
            size = ROW_BYTES + utf8_bytes(head)
            self._room(owner, size + sum(s for _, _, s in rows), set())
            self.db["conversations"].insert(
                {
                    "id": conversation_id,
                    "owner": owner,
                    "created_at": now,
                    "last_used": now,
                    "metadata": head,
                    "bytes": size,
                }
            )
            self._append(conversation_id, rows, now)
            return _conversation(conversation_id, now, head)

        try:
            return self._write(work)
        except _NoRoom as no_room:
            return no_room.refusal

    def conversation(self, conversation_id: str, owner: str) -> dict[str, Any]:
        """``owner``'s conversation object (:class:`Missing`: none of theirs)."""

        def work():
            return self._owned_conversation(conversation_id, owner)

        return _conversation(conversation_id, *self._reading(work))

    def update_conversation(
        self, conversation_id: str, owner: str, metadata: dict[str, str]
    ) -> dict[str, Any]:
        def work():
            self._owned_conversation(conversation_id, owner)
            old = self.db.execute(
                "SELECT metadata FROM conversations WHERE id = ?", [conversation_id]
            ).fetchone()[0]
            head = dump(metadata)
            self.db.execute(
                "UPDATE conversations SET metadata = ?, bytes = bytes + ?, last_used = ? "
                "WHERE id = ?",
                [head, utf8_bytes(head) - utf8_bytes(old), time.time(), conversation_id],
            )
            return self._owned_conversation(conversation_id, owner)

        return _conversation(conversation_id, *self._write(work))

    def delete_conversation(self, conversation_id: str, owner: str) -> None:
        """Delete ``owner``'s conversation and its items (:class:`Missing`: none of theirs).
        Responses made in it stay (their own objects)."""

        def work() -> None:
            self._owned_conversation(conversation_id, owner)
            drop_conversation(self.db, conversation_id)

        self._write(work)

    def conversation_items(self, conversation_id: str, owner: str) -> History:
        """Every item of ``owner``'s conversation, oldest first, and the bytes the
        conversation holds (what a response made in it continues)."""

        def work():
            self._owned_conversation(conversation_id, owner)
            size = self.db.execute(
                "SELECT bytes FROM conversations WHERE id = ?", [conversation_id]
            ).fetchone()[0]
            rows = self.db.execute(
                "SELECT item FROM conversation_items WHERE conversation = ? ORDER BY seq",
                [conversation_id],
            ).fetchall()
            return tuple(_loads(row[0]) for row in rows), size

        items, size = self._reading(work)
        return History(items, size)

    def list_items(
        self,
        conversation_id: str,
        owner: str,
        after: str | None = None,
        limit: int = 20,
        ascending: bool = False,
    ) -> ItemPage:
        """A page of ``owner``'s conversation's items after the item ``after`` (in the
        order asked for)."""

        def work():
            self._owned_conversation(conversation_id, owner)
            order, compare, start = ("ASC", ">", -1) if ascending else ("DESC", "<", 2**62)
            if after is not None:
                start = self._item_seq(conversation_id, after)
            return self.db.execute(
                f"SELECT item FROM conversation_items WHERE conversation = ? AND seq {compare} ? "
                f"ORDER BY seq {order} LIMIT ?",
                [conversation_id, start, limit + 1],
            ).fetchall()

        rows = self._reading(work)
        return ItemPage([_loads(row[0]) for row in rows[:limit]], len(rows) > limit)

    def add_items(
        self, conversation_id: str, owner: str, items: list[dict[str, Any]]
    ) -> Refusal | None:
        """Append ``items`` (each with its ``id``) to ``owner``'s conversation; None, or
        why they could not be stored."""

        def work() -> None:
            self._owned_conversation(conversation_id, owner)
            rows = self._item_rows(items)
            self._room(owner, sum(s for _, _, s in rows), {conversation_id})
            self._append(conversation_id, rows, time.time())

        try:
            self._write(work)
        except _NoRoom as no_room:
            return no_room.refusal
        return None

    def item(self, conversation_id: str, owner: str, item_id: str) -> dict[str, Any]:
        def work():
            self._owned_conversation(conversation_id, owner)
            seq = self._item_seq(conversation_id, item_id)
            return self.db.execute(
                "SELECT item FROM conversation_items WHERE seq = ?", [seq]
            ).fetchone()[0]

        return _loads(self._reading(work))

    def delete_item(self, conversation_id: str, owner: str, item_id: str) -> dict[str, Any]:
        """Delete one item of ``owner``'s conversation; the conversation object."""

        def work():
            self._owned_conversation(conversation_id, owner)
            seq = self._item_seq(conversation_id, item_id)
            size = self.db.execute(
                "SELECT bytes FROM conversation_items WHERE seq = ?", [seq]
            ).fetchone()[0]
            self.db.execute("DELETE FROM conversation_items WHERE seq = ?", [seq])
            self.db.execute(
                "UPDATE conversations SET bytes = bytes - ? WHERE id = ?", [size, conversation_id]
            )
            return self._owned_conversation(conversation_id, owner)

        return _conversation(conversation_id, *self._write(work))

    def _owned_conversation(self, conversation_id: str, owner: str) -> tuple[float, str]:
        found = self.db.execute(
            "SELECT created_at, metadata FROM conversations WHERE id = ? AND owner = ?",
            [conversation_id, owner],
        ).fetchone()
        if found is None:
            raise Missing(
                f"no conversation '{conversation_id}' (it was deleted, or belongs to another "
                "API key)"
            )
        return found[0], found[1]

    def _item_seq(self, conversation_id: str, item_id: str) -> int:
        found = self.db.execute(
            "SELECT seq FROM conversation_items WHERE conversation = ? AND id = ? "
            "ORDER BY seq LIMIT 1",
            [conversation_id, item_id],
        ).fetchone()
        if found is None:
            raise Missing(f"no item '{item_id}' in conversation '{conversation_id}'")
        return found[0]

    def _item_rows(self, items: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
        rows = []
        for item in items:
            text = dump(item)
            size = ROW_BYTES + utf8_bytes(text)
            self._too_large(size, f"the conversation item {item['id']}")
            rows.append((item["id"], text, size))
        return rows

    def _append(self, conversation_id: str, rows: list[tuple[str, str, int]], now: float) -> None:
        self.db.conn.executemany(
            "INSERT INTO conversation_items (conversation, id, item, bytes) VALUES (?, ?, ?, ?)",
            [[conversation_id, item_id, text, size] for item_id, text, size in rows],
        )
        self.db.execute(
            "UPDATE conversations SET bytes = bytes + ?, last_used = ? WHERE id = ?",
            [sum(size for _, _, size in rows), now, conversation_id],
        )

    # ------------------------------------------------------------ the whole store
    def usage(self, owner: str | None = None) -> int:
        """The bytes stored for ``owner`` (None: for everyone), as the budget counts them."""
        return self._reading(
            lambda: total_bytes(self.db) if owner is None else owner_bytes(self.db, owner)
        )

    def file_bytes(self) -> int:
        """The database file and its write-ahead log, on disk."""
        size = 0
        for side in (self.path, self.path.with_name(self.path.name + "-wal")):
            try:
                size += side.stat().st_size
            except OSError:
                continue
        return size

    def clear(self) -> Cleared:
        """Delete every stored response and conversation, and give the space back."""

        def work() -> Cleared:
            counts = [
                self.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("responses", "conversations")
            ]
            size = self.file_bytes()
            for table in ("conversation_items", "conversations", "responses"):
                self.db.execute(f"DELETE FROM {table}")
            return Cleared(counts[0], counts[1], size)

        cleared = self._write(work)

        def shrink() -> int:
            with self._errors():
                self.db.execute("VACUUM")
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            return self.file_bytes()

        left = self._guarded(shrink)
        return Cleared(cleared.responses, cleared.conversations, max(0, cleared.bytes - left))


def _loads(text: str) -> Any:
    return json.loads(text)


def _response(response_json: str, output_json: str) -> dict[str, Any]:
    response = _loads(response_json)
    response["output"] = _loads(output_json)  # back in its place (the key was kept)
    return response


def _conversation(conversation_id: str, created_at: float, metadata: str) -> dict[str, Any]:
    return {
        "id": conversation_id,
        "object": "conversation",
        "created_at": int(created_at),
        "metadata": _loads(metadata),
    }
