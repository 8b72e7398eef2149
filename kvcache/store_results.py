"""What :class:`~kvcache.store.DiskStore`'s calls answer: a save, a session, the whole
store's figures (read from its database by :func:`read_stats`). Plain values (they cross to
the UI's threads as they are)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlite_utils import Database

from kvcache.store_format import LIVE_PAGES


@dataclass(frozen=True)
class SaveResult:
    session: str | None  # None: a chain kept by its tokens alone (a prefix)
    head: str | None  # the key of the chain's last saved page
    pages: int  # pages in the saved chain
    tokens: int  # tokens in the saved chain (fewer than given only if a kv=None page was gone)
    pages_written: int  # pages that were not stored yet
    bytes_written: int
    evicted_sessions: tuple[str, ...]  # dropped by the budget (may include this one)
    gave_way: bool = False  # nothing written: the disk is nearly full (its reserve)


@dataclass(frozen=True)
class SessionInfo:
    name: str
    fingerprint: str
    tokens: int
    pages: int
    nbytes: int  # the chain's bytes, pages shared with other sessions included
    updated_at: float  # last save
    last_used: float  # last save or load


@dataclass(frozen=True)
class StoreStats:
    sessions: int
    prefixes: int  # chains kept for any request by their tokens (no session name)
    pages: int
    bytes: int  # of pages (tokens + kv + snapshot)
    file_bytes: int  # the database file and its write-ahead log
    orphan_pages: int  # pages no session reaches (0 unless something went wrong)
    budget_bytes: int
    saves: int  # counters since the store was created
    loads: int
    restored_pages: int
    restored_tokens: int
    dropped_pages: int  # failed a check and were deleted
    evicted_sessions: int
    evicted_prefixes: int
    pages_written: int  # new pages (a page already stored is never written again)
    bytes_written: int  # their bytes


_COUNTERS = (
    "saves",
    "loads",
    "restored_pages",
    "restored_tokens",
    "dropped_pages",
    "evicted_sessions",
    "evicted_prefixes",
    "pages_written",
    "bytes_written",
)


def read_stats(db: Database, path: Path, budget_bytes: int) -> StoreStats:
    """The store's figures (inside a read transaction on ``db``, the database at ``path``)."""
    sessions = db.execute("SELECT count(*) FROM sessions").fetchone()[0]
    prefixes = db.execute("SELECT count(*) FROM prefixes").fetchone()[0]
    pages, nbytes = db.execute("SELECT count(*), coalesce(sum(nbytes), 0) FROM pages").fetchone()
    orphans = db.execute(
        f"{LIVE_PAGES} SELECT count(*) FROM pages WHERE key NOT IN live"
    ).fetchone()[0]
    counters = dict(db.execute("SELECT name, value FROM counters").fetchall())
    files = [path, path.with_name(path.name + "-wal")]
    return StoreStats(
        sessions=sessions,
        prefixes=prefixes,
        pages=pages,
        bytes=nbytes,
        file_bytes=sum(f.stat().st_size for f in files if f.exists()),
        orphan_pages=orphans,
        budget_bytes=budget_bytes,
        **{name: counters.get(name, 0) for name in _COUNTERS},
    )
