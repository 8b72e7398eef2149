"""How much the stored responses may hold, and what goes to make room (inside one write
transaction of :mod:`core.api.responses_store`).

Three bounds, in UTF-8 bytes as stored (``responses.bytes``, ``conversations.bytes``):

- **each API key's share**: the budget split evenly between the server's keys (one owner,
  the whole budget, without keys). A key's writes evict only that key's own responses and
  conversations, least recently used first: one key's many large stores can never evict
  another key's;
- **the total**: the budget, a share of the data folder's disk budget
  (``core.paths.stored_responses_budget``). Owners the server no longer has a key for
  (rows of keys removed since) are evicted first;
- **the disk's reserve**, as the KV cache keeps it (``kvcache.sqlite_file.disk_room``):
  a write that would eat into it writes nothing (the chat history always has room). Its
  bytes count twice there: once in the write-ahead log, once in the file (less the free
  pages inside the file, which SQLite reuses first).

What is evicted: a conversation whole, or a response no other response continues (a leaf
of its chain: the chain's first responses stay, so what is left of it is still whole).
A hidden (deleted) response goes with the last response continuing it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from sqlite_utils import Database

from core.api.responses_tables import drop_conversation, drop_response

WRITE_FACTOR = 2  # a write takes its bytes in the write-ahead log and again in the file


@dataclass(frozen=True)
class StoreBudget:
    """The stored responses' bounds: ``total_bytes`` for every owner together, split
    evenly between ``owners`` (the owners of the server's API keys); the disk keeps
    ``reserve_bytes`` free (None: the KV cache's reserve, max(1 GB, 5 % of the disk))."""

    total_bytes: int
    owners: tuple[str, ...] = ()
    reserve_bytes: int | None = None

    @property
    def owner_bytes(self) -> int:
        """One owner's share."""
        return self.total_bytes // max(1, len(self.owners))

    @property
    def item_bytes(self) -> int:
        """The most one stored response, or one conversation item, may take: a quarter of
        an owner's share, so no single write empties a key's store."""
        return self.owner_bytes // 4


@dataclass(frozen=True)
class Refusal:
    """Why a write found no room: ``kind`` is ``item`` (one response or item past
    ``item_bytes``), ``owner`` (past the key's share with what must stay), ``total`` or
    ``disk`` (the disk's reserve); ``message`` says so in one line."""

    kind: str
    message: str


@dataclass(frozen=True)
class Victim:
    kind: str  # "response" or "conversation"
    id: str
    bytes: int


def owner_bytes(db: Database, owner: str) -> int:
    return db.execute(
        "SELECT (SELECT coalesce(sum(bytes), 0) FROM responses WHERE owner = ?) + "
        "(SELECT coalesce(sum(bytes), 0) FROM conversations WHERE owner = ?)",
        [owner, owner],
    ).fetchone()[0]


def total_bytes(db: Database) -> int:
    return db.execute(
        "SELECT (SELECT coalesce(sum(bytes), 0) FROM responses) + "
        "(SELECT coalesce(sum(bytes), 0) FROM conversations)"
    ).fetchone()[0]


def free_list_bytes(db: Database) -> int:
    """Space inside the file that SQLite reuses before it grows the file."""
    pages = db.execute("PRAGMA freelist_count").fetchone()[0]
    return pages * db.execute("PRAGMA page_size").fetchone()[0]


def _victims(db: Database, owners: tuple[str, ...], others: bool, keep: set[str]) -> list[Victim]:
    """What may go, least recently used first: the conversations and leaf responses of
    ``owners`` (``others``: of every owner but those), ``keep`` aside."""
    where = f"owner {'NOT IN' if others else 'IN'} (SELECT value FROM json_each(?))"
    chosen = json.dumps(list(owners))
    return [
        Victim(kind, rid, size)
        for kind, rid, size in db.execute(
            f"""SELECT kind, id, bytes FROM (
                SELECT 'response' AS kind, id, bytes, last_used FROM responses r
                WHERE {where} AND hidden = 0
                    AND NOT EXISTS (SELECT 1 FROM responses d WHERE d.previous = r.id)
                UNION ALL
                SELECT 'conversation', id, bytes, last_used FROM conversations WHERE {where}
            ) ORDER BY last_used, id""",
            [chosen, chosen],
        )
        if rid not in keep
    ]


def evict(
    db: Database,
    owners: tuple[str, ...],
    keep: set[str],
    still_needed: Callable[[int], bool],
    others: bool = False,
) -> int:
    """Evict the rows of ``owners`` (``others``: of every owner but those; see
    :func:`_victims`) while ``still_needed(freed)``; returns the bytes freed. A leaf
    evicted may make its parent a leaf: the list is read again until nothing is left."""
    freed = 0
    while still_needed(freed):
        victims = _victims(db, owners, others, keep)
        if not victims:
            break
        for victim in victims:
            if not still_needed(freed):
                break
            if victim.kind == "response":
                freed += drop_response(db, victim.id)
            else:
                freed += drop_conversation(db, victim.id)
    return freed


def make_room(
    db: Database,
    budget: StoreBudget,
    owner: str,
    need: int,
    keep: set[str],
    disk_room: int,
) -> Refusal | None:
    """Evict what must go for ``owner`` to write ``need`` more bytes (``keep``: the chain or
    conversation the write extends, never evicted). Returns None when there is room, or
    why there is none (the caller then rolls back: nothing is evicted)."""
    if WRITE_FACTOR * need - free_list_bytes(db) > disk_room:
        # as the KV cache: a write that would eat into the disk's reserve writes nothing
        return Refusal(
            "disk", "the disk is nearly full: the data folder keeps its reserve free for the chats"
        )
    mine = (owner,)
    used = owner_bytes(db, owner)
    if used + need > budget.owner_bytes:
        evict(db, mine, keep, lambda freed: used - freed + need > budget.owner_bytes)
        if owner_bytes(db, owner) + need > budget.owner_bytes:
            return Refusal(
                "owner",
                f"this API key's stored responses and conversations may take "
                f"{budget.owner_bytes:,} bytes, and the conversation this write extends "
                "takes more with it",
            )
    total = total_bytes(db)
    if total + need > budget.total_bytes:
        if budget.owners:  # keys removed since: theirs go first
            total -= evict(
                db,
                budget.owners,
                keep,
                lambda freed: total - freed + need > budget.total_bytes,
                others=True,
            )
        total -= evict(db, mine, keep, lambda freed: total - freed + need > budget.total_bytes)
        if total + need > budget.total_bytes:
            return Refusal(
                "total", f"the stored responses may take {budget.total_bytes:,} bytes in all"
            )
    return None
