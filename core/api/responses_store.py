"""Stored responses of the Responses API, kept in SQLite (``responses.db``, beside
``chats.db`` in the data folder), so ``previous_response_id`` works after a restart.

A row is one response: its id, the cache namespace's owner (an API key's, never the key:
another key's requests cannot read, continue or delete it), the response object as it was
answered (``GET /v1/responses/{id}``) and the conversation it continued, as input items;
a continuation is that conversation, the response's output and the new input, so it
renders to a prompt that extends the previous one and its prefix is a cache hit.

The store keeps at most ``budget_bytes`` of rows: past it, the oldest go. One connection,
opened on first use; every call takes the store's lock (the API calls it from worker
threads, never the event loop).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from core.errors import StoreError
from kvcache.sqlite_file import SqliteFile

DEFAULT_BUDGET_BYTES = 256 * 1024 * 1024


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


@dataclass(frozen=True)
class StoredResponse:
    id: str
    response: dict[str, Any]  # the response object as it was answered
    conversation: list[dict[str, Any]]  # the input items it answered (its whole conversation)

    def continued(self) -> tuple[dict[str, Any], ...]:
        """The conversation a continuation of this response extends: its input and output."""
        return (*self.conversation, *self.response.get("output", ()))


class ResponseStore(SqliteFile):
    """The stored responses at ``path`` (created, and migrated, on first use)."""

    error = StoreError
    migrations = [_migration_1]
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

    def __init__(self, path: Path, budget_bytes: int = DEFAULT_BUDGET_BYTES):
        self.path = Path(path)
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()

    def _open(self) -> None:
        if self.db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._connect(2.0, self._setup)

    def _setup(self) -> None:
        self.db.enable_wal()

    def close(self) -> None:
        with self._lock:
            if self.db is not None:
                self.db.close()
                self.db = None

    def put(
        self,
        owner: str,
        response: dict[str, Any],
        conversation: tuple[dict[str, Any], ...] | list[dict[str, Any]],
    ) -> None:
        """Keep ``response`` (answering ``conversation``) for ``owner``; the oldest rows
        go while the store is past its budget."""
        row = {
            "id": response["id"],
            "owner": owner,
            "created_at": time.time(),
            "response": json.dumps(response, ensure_ascii=False),
            "conversation": json.dumps(list(conversation), ensure_ascii=False),
        }
        row["bytes"] = len(row["response"]) + len(row["conversation"])
        with self._lock:
            self._open()
            with self._transaction():
                self.db["responses"].insert(row, replace=True)
                total = self.db.execute("SELECT COALESCE(SUM(bytes), 0) FROM responses").fetchone()
                excess = total[0] - self.budget_bytes
                for rid, size in self.db.execute(
                    "SELECT id, bytes FROM responses ORDER BY created_at"
                ).fetchall():
                    if excess <= 0 or rid == row["id"]:
                        break
                    self.db.execute("DELETE FROM responses WHERE id = ?", [rid])
                    excess -= size

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The response ``response_id`` of ``owner``'s (None: no such response of theirs)."""
        with self._lock:
            self._open()
            with self._read():
                found = self.db.execute(
                    "SELECT response, conversation FROM responses WHERE id = ? AND owner = ?",
                    [response_id, owner],
                ).fetchone()
        if found is None:
            return None
        return StoredResponse(response_id, json.loads(found[0]), json.loads(found[1]))

    def delete(self, response_id: str, owner: str) -> bool:
        """Delete ``owner``'s response ``response_id``; whether there was one."""
        with self._lock:
            self._open()
            with self._transaction():
                cursor = self.db.execute(
                    "DELETE FROM responses WHERE id = ? AND owner = ?", [response_id, owner]
                )
                return cursor.rowcount > 0
