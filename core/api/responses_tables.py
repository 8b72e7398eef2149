"""The tables of ``responses.db`` (:mod:`core.api.responses_store`), their numbered
migrations, and the row operations every write shares: JSON in UTF-8 bytes, walking a chain
of responses, and deleting a response without breaking the responses that continue it.

Schema 2 (migrated from 1 in place)::

    responses            one row per stored response
      id, owner          the response; the cache namespace's owner (an API key's, never a key)
      created_at, last_used
      previous           the stored response it continues (NULL: the first of its chain)
      conversation       the conversation it was made in (its items are the conversation's)
      hidden             1: deleted by its owner, kept while responses continuing it are stored
      input              JSON: the items it added to the conversation it continues (only those)
      response           JSON: the response object, its "output" null (kept in ``output``)
      output             JSON: its output items
      bytes              UTF-8 bytes of the three, plus ROW_BYTES
    conversations        id, owner, created_at, last_used, metadata (JSON), bytes (the row's
                         and all its items')
    conversation_items   seq (their order), conversation, id, item (JSON), bytes

A continuation is a link plus its own items, never a copy of the conversation: a chain of
n responses holds each item once, so its bytes grow linearly (schema 1 stored the whole
conversation in every row: 45 links of a 7.5 MB field made one row of 337 MB).

Invariant, kept by every write: every response's ``previous`` is stored (deleting a
response that others continue hides it instead; a hidden response goes with the last
response continuing it), so reading a chain back always reaches its first response.
"""

from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Database

ROW_BYTES = 256  # what a row costs beyond its JSON (keys, indexes): ten thousand tiny rows count


def dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def utf8_bytes(text: str) -> int:
    """The bytes ``text`` takes on disk (SQLite stores TEXT as UTF-8), not its characters."""
    return len(text.encode("utf-8"))


def _migration_1(db: Database) -> None:
    db.execute(
        """CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            created_at REAL NOT NULL,
            response TEXT NOT NULL,
            conversation TEXT NOT NULL,
            bytes INTEGER NOT NULL
        )"""
    )
    db.execute("CREATE INDEX responses_created ON responses(created_at)")


def _migration_2(db: Database) -> None:
    """Links instead of copies, conversations, and sizes in UTF-8 bytes. A row of schema 1
    held its whole conversation: it becomes the first response of its own chain (its
    input that conversation), its size counted again in bytes; the budget then evicts
    what no longer fits, least recently used first."""
    db.execute("ALTER TABLE responses RENAME TO responses_1")
    db.execute("DROP INDEX responses_created")
    db.execute(
        """CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            created_at REAL NOT NULL,
            last_used REAL NOT NULL,
            previous TEXT,
            conversation TEXT,
            hidden INTEGER NOT NULL DEFAULT 0,
            input TEXT NOT NULL,
            response TEXT NOT NULL,
            output TEXT NOT NULL,
            bytes INTEGER NOT NULL
        )"""
    )
    db.execute("CREATE INDEX responses_previous ON responses(previous)")
    db.execute("CREATE INDEX responses_owner_used ON responses(owner, last_used)")
    db.execute(
        f"""INSERT INTO responses
            (id, owner, created_at, last_used, input, response, output, bytes)
        SELECT id, owner, created_at, created_at, conversation,
            json_set(response, '$.output', json('null')),
            coalesce(json_extract(response, '$.output'), '[]'),
            length(CAST(conversation AS BLOB)) + length(CAST(response AS BLOB)) + {ROW_BYTES}
        FROM responses_1"""
    )
    db.execute("DROP TABLE responses_1")
    db.execute(
        """CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            created_at REAL NOT NULL,
            last_used REAL NOT NULL,
            metadata TEXT NOT NULL,
            bytes INTEGER NOT NULL
        )"""
    )
    db.execute("CREATE INDEX conversations_owner_used ON conversations(owner, last_used)")
    db.execute(
        """CREATE TABLE conversation_items (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation TEXT NOT NULL,
            id TEXT NOT NULL,
            item TEXT NOT NULL,
            bytes INTEGER NOT NULL
        )"""
    )
    db.execute("CREATE INDEX conversation_items_by_id ON conversation_items(conversation, id)")
    db.execute("CREATE INDEX conversation_items_order ON conversation_items(conversation, seq)")


MIGRATIONS = [_migration_1, _migration_2]

# a response and every response it continues, nearest first (depth 0: the response itself)
CHAIN = """WITH RECURSIVE chain(id, previous, depth) AS (
    SELECT id, previous, 0 FROM responses WHERE id = ?
    UNION ALL
    SELECT r.id, r.previous, c.depth + 1 FROM responses r JOIN chain c ON r.id = c.previous
)"""


def touch_chain(db: Database, response_id: str, now: float) -> None:
    """Mark ``response_id`` and every response it continues used ``now``: a chain is
    evicted from its newest end, the whole conversation ageing together."""
    db.execute(
        f"{CHAIN} UPDATE responses SET last_used = ? WHERE id IN (SELECT id FROM chain)",
        [response_id, now],
    )


def chain_ids(db: Database, response_id: str) -> set[str]:
    return {row[0] for row in db.execute(f"{CHAIN} SELECT id FROM chain", [response_id])}


def has_dependants(db: Database, response_id: str) -> bool:
    found = db.execute("SELECT 1 FROM responses WHERE previous = ? LIMIT 1", [response_id])
    return found.fetchone() is not None


def drop_response(db: Database, response_id: str) -> int:
    """Delete ``response_id`` (no response continues it), then each hidden response it
    continued that nothing else continues any more; returns the bytes freed."""
    freed = 0
    while response_id is not None:
        row = db.execute(
            "SELECT previous, bytes FROM responses WHERE id = ?", [response_id]
        ).fetchone()
        if row is None:
            break
        db.execute("DELETE FROM responses WHERE id = ?", [response_id])
        freed += row[1]
        previous = row[0]
        if previous is None or has_dependants(db, previous):
            break
        hidden = db.execute("SELECT hidden FROM responses WHERE id = ?", [previous]).fetchone()
        response_id = previous if hidden is not None and hidden[0] else None
    return freed


def drop_conversation(db: Database, conversation_id: str) -> int:
    """Delete a conversation and its items; returns the bytes freed."""
    row = db.execute("SELECT bytes FROM conversations WHERE id = ?", [conversation_id]).fetchone()
    db.execute("DELETE FROM conversation_items WHERE conversation = ?", [conversation_id])
    db.execute("DELETE FROM conversations WHERE id = ?", [conversation_id])
    return row[0] if row is not None else 0
