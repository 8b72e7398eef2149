"""What the disk store's budget allows, as functions over its numbers and its database.

A store that keeps its *files* within its budget (``DiskStore(save_bytes=...)``, as the
engine's disk tier opens it) must leave room beside its pages for what SQLite adds: one
write transaction adds at most about ``save_bytes`` of pages (a longer chain goes in
several), the write-ahead log is cut back to that after each, and the pages may fill the
budget less twice that and WRITE_FIXED_BYTES (the new pages sit in the log, then in the file
before eviction frees as much), less FIXED_FILE_BYTES for SQLite's own tables, each page
counted with one SQLite page more than its bytes (its blob's last, part-full page and its
row). :mod:`kvcache.store` runs these inside its transactions.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from sqlite_utils import Database

log = logging.getLogger(__name__)

SQLITE_PAGE_SIZE = 65536  # set when the file is created: long overflow chains read faster
MAX_SAVE_BYTES = 256 * 2**20
FIXED_FILE_BYTES = 2**20
WRITE_FIXED_BYTES = 8 * 65536  # what a write adds to the log besides its pages: table pages


def save_bytes_for(budget_bytes: int) -> int:
    """The most one write transaction adds to a store that keeps its files within
    ``budget_bytes`` (``DiskStore``'s ``save_bytes``): a sixteenth of it, between four
    SQLite pages and ``MAX_SAVE_BYTES``."""
    return min(max(budget_bytes // 16, 4 * SQLITE_PAGE_SIZE), MAX_SAVE_BYTES)


def pages_limit(budget_bytes: int, save_bytes: int | None = None) -> int:
    """What the pages of a store that keeps its files within ``budget_bytes`` may count (each
    page its bytes and one SQLite page): see the module's docstring."""
    save_bytes = save_bytes_for(budget_bytes) if save_bytes is None else save_bytes
    return budget_bytes - 2 * (save_bytes + WRITE_FIXED_BYTES) - FIXED_FILE_BYTES


def write_ends(
    keys: Sequence[str], prepared: dict[str, tuple[dict, dict]], save_bytes: int | None
) -> list[int]:
    """Where a chain's write transactions end (page counts): each adds about ``save_bytes``
    of the new pages (``prepared``: their rows, by key) at most, one page at least, and each
    but the last ends on a new page. One transaction without ``save_bytes``."""
    ends: list[int] = []
    if save_bytes is not None:
        size = last_new = 0
        for index, key in enumerate(keys):
            if key not in prepared:
                continue
            nbytes = prepared[key][0]["nbytes"] + SQLITE_PAGE_SIZE  # as the budget counts
            if size and size + nbytes > save_bytes:
                ends.append(last_new)
                size = 0
            size, last_new = size + nbytes, index + 1
    return [*ends, len(keys)]


def evict_to(
    db: Database,
    limit: int,
    overhead: int,
    fingerprint: str | None,
    spared: Sequence[str],
    delete_orphans: Callable[[], tuple[int, int]],
) -> tuple[int, list[str], int]:
    """Inside a transaction: delete chains until the pages (each its bytes and ``overhead``)
    count ``limit`` at most: other models' chains before ``fingerprint``'s, prefixes before
    sessions, least recently used first, the prefix rows ``spared`` kept (a chain being
    written). ``delete_orphans`` deletes the pages no chain reaches any more: (pages,
    bytes). Returns (bytes freed, the sessions evicted, the prefixes evicted)."""
    freed = delete_orphans()[1]
    total = db.execute(
        "SELECT coalesce(sum(nbytes), 0) + count(*) * ? FROM pages", [overhead]
    ).fetchone()[0]
    evicted: list[str] = []
    prefixes = 0
    spared = list(spared)
    while total > limit:
        victim = db.execute(
            (
                "SELECT is_session, id FROM (SELECT 0 AS is_session, head AS id, "
                "fingerprint, last_used FROM prefixes WHERE head NOT IN "
                f"({', '.join('?' * len(spared))}) UNION ALL SELECT 1, name, fingerprint, "
                "last_used FROM sessions) ORDER BY coalesce(fingerprint = ?, 0), is_session, "
                "last_used, id LIMIT 1"
            ),
            [*spared, fingerprint],
        ).fetchone()
        if victim is None:
            break
        if victim[0]:
            db.execute("DELETE FROM sessions WHERE name = ?", [victim[1]])
            evicted.append(victim[1])
        else:
            db.execute("DELETE FROM prefixes WHERE head = ?", [victim[1]])
            prefixes += 1
        count, nbytes = delete_orphans()
        freed, total = freed + nbytes, total - nbytes - count * overhead
    return freed, evicted, prefixes


def shrink_file(db: Database, budget_bytes: int, save_bytes: int, room: int) -> None:
    """A file grown past its budget (a budget lowered since, a file from before files were
    budgeted): rewritten without its free pages, where the disk has ``room`` for the copy.
    Saves reuse free pages, so a store kept within its budget never needs it."""
    try:
        page_count, free = db.execute(
            "SELECT * FROM pragma_page_count, pragma_freelist_count"
        ).fetchone()
        if page_count * SQLITE_PAGE_SIZE <= budget_bytes - save_bytes:
            return
        if (page_count - free) * SQLITE_PAGE_SIZE * 2 > room:
            return
        log.info("the KV cache file is past its budget: rewriting it without its free pages")
        db.execute("VACUUM")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.DatabaseError as exc:
        log.debug("shrinking the file skipped: %s", exc)


def checkpoint(db: Database, path: Path, save_bytes: int | None, shrink: bool = False) -> None:
    """Move what the write-ahead log holds into the database file at ``path``, as far as
    readers allow (PASSIVE: waits for no one). Restores then read the file instead of frames
    out of the log; a busy or failed checkpoint is simply retried after the next save. A log
    past ``save_bytes`` (a store that keeps its files within its budget) is cut back to
    nothing (TRUNCATE, waiting a moment for readers), or it would hold several writes at
    once. ``shrink`` (the cache was emptied because the disk is past its reserve): give the
    space back to the disk (a VACUUM of an empty database writes a few pages) and truncate
    the log, as far as readers allow."""
    try:
        if shrink:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.execute("VACUUM")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        elif save_bytes is not None and _wal_bytes(path) > save_bytes:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        else:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    except sqlite3.DatabaseError as exc:
        log.debug("checkpoint skipped: %s", exc)


def _wal_bytes(path: Path) -> int:
    try:
        return path.with_name(path.name + "-wal").stat().st_size
    except OSError:
        return 0
