"""The on-disk format of the KV cache store: page keys, checksums, the schema.

Pure functions and constants, no connection: :mod:`kvcache.store` uses them to write and
check pages, and anything that only needs a page's key (the disk tier, kvcache/persist.py) can
compute it without a database.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from sqlite_utils import Database


@dataclass(frozen=True)
class PageData:
    """A page to save. ``kv=None``: not serialized, because the caller learned from
    :meth:`DiskStore.missing_keys` that the store has it."""

    tokens: tuple[int, ...]
    kv: bytes | None
    snapshot: bytes | None = None


@dataclass(frozen=True)
class StoredPage:
    key: str
    tokens: tuple[int, ...]
    kv: bytes
    snapshot: bytes | None


# -- hashing: every part length-prefixed, so no two inputs share an encoding --


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as int32 little-endian (a page holds at least one)."""
    if not tokens:
        raise ValueError("a page holds at least one token")
    try:
        return struct.pack(f"<{len(tokens)}i", *tokens)
    except struct.error as exc:
        raise ValueError(f"token ids must be int32: {exc}") from None


def unpack_tokens(blob: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{len(blob) // 4}i", blob)


def _sha256(*parts: bytes | None) -> str:
    digest = hashlib.sha256()
    for part in parts:
        if part is None:  # a missing snapshot differs from an empty one
            digest.update(b"\xff" * 8)
            continue
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()


def page_key(fingerprint: str, parent: str | None, tokens: Sequence[int] | bytes) -> str:
    """A page's key: sha256 over the model fingerprint, the parent page's key (for a
    chain's first page its namespace's root: "" for namespace "") and the packed token ids."""
    blob = tokens if isinstance(tokens, bytes) else pack_tokens(tokens)
    return _sha256(fingerprint.encode(), (parent or "").encode(), blob)


# -- cache namespaces: prefixes are shared only inside one --
#
# A chain's first page has its namespace's root as parent: None for namespace "" (every
# page written before namespaces existed is one of those), else "ns:" and the SHA-256 of
# the namespace's name. The root enters the first page's key, and so every key after it:
# the same tokens in two namespaces are two chains that never meet, while inside one
# namespace a page keeps one key (stored once, never rewritten). A root is no page's key
# (those are 64 hex digits): a walk up the parents ends at it.

ROOT_PREFIX = "ns:"


def namespace_root(namespace: str) -> str | None:
    """The parent key of ``namespace``'s first pages (None for the namespace "")."""
    if not namespace:
        return None
    return ROOT_PREFIX + hashlib.sha256(namespace.encode()).hexdigest()


def is_root(key: str | None) -> bool:
    """Whether ``key`` (a parent) is where a chain starts rather than a page."""
    return key is None or key.startswith(ROOT_PREFIX)


def session_row(session: str, namespace: str) -> str:
    """The store's name for ``session`` of ``namespace`` (sessions of two namespaces never
    share a row; namespace "" keeps the bare name, as before namespaces)."""
    return f"{namespace}/{session}" if namespace else session


def chain_keys(
    fingerprint: str, pages_tokens: Sequence[Sequence[int]], namespace: str = ""
) -> list[str]:
    """The keys of a chain of pages of ``namespace``, first page first (no database needed)."""
    keys: list[str] = []
    root = namespace_root(namespace)
    for tokens in pages_tokens:
        keys.append(page_key(fingerprint, keys[-1] if keys else root, tokens))
    return keys


def page_checksum(tokens: bytes, kv: bytes, snapshot: bytes | None) -> str:
    """CRC-32 over the length-prefixed parts: it catches flipped bytes and truncation, and
    runs much faster than SHA-256, which bounded restore reads (docs/benchmarks.md). The
    page key (what the content is) stays SHA-256; this only says the bytes are intact."""
    crc = 0
    for part in (tokens, kv, snapshot):
        if part is None:  # a missing snapshot differs from an empty one
            crc = zlib.crc32(b"\xff" * 8, crc)
            continue
        crc = zlib.crc32(len(part).to_bytes(8, "little"), crc)
        crc = zlib.crc32(part, crc)
    return f"crc32:{crc:08x}"


def page_problem(
    key: str,
    parent: str | None,
    fingerprint: str,
    tokens: bytes,
    checksum: str,
    kv: bytes | None,
    snapshot: bytes | None,
) -> str | None:
    """Why a stored page must not be used, or None."""
    if not tokens or len(tokens) % 4 or page_key(fingerprint, parent, tokens) != key:
        return "key does not match its fingerprint, parent and tokens"
    if kv is None:
        return "no K/V data"
    if page_checksum(tokens, kv, snapshot) != checksum:
        return "checksum mismatch"
    return None


# -- schema: numbered migrations, PRAGMA user_version = how many were applied --


def _migration_1(db: Database) -> None:
    db.execute(
        """CREATE TABLE pages (
            key TEXT PRIMARY KEY,       -- page_key(fingerprint, parent, tokens)
            parent TEXT,                -- the previous page's key; NULL for a first page
            fingerprint TEXT NOT NULL,  -- the model's
            tokens BLOB NOT NULL,       -- token ids, int32 little-endian
            nbytes INTEGER NOT NULL,    -- len(tokens) + len(kv) + len(snapshot)
            checksum TEXT NOT NULL,     -- crc32 over tokens, kv, snapshot
            last_used REAL NOT NULL
        )"""
    )
    # The bulk lives apart, so that walks, sums and last_used updates never read it.
    db.execute(
        """CREATE TABLE page_data (
            key TEXT PRIMARY KEY,       -- pages.key
            kv BLOB NOT NULL,           -- K/V of every full-attention layer (opaque)
            snapshot BLOB               -- sliding-window / recurrent state at the page's end
        )"""
    )
    db.execute(
        """CREATE TABLE sessions (
            name TEXT PRIMARY KEY,      -- the chat's name
            fingerprint TEXT NOT NULL,
            head TEXT NOT NULL,         -- the key of the chain's last page
            tokens INTEGER NOT NULL,
            pages INTEGER NOT NULL,
            nbytes INTEGER NOT NULL,
            updated_at REAL NOT NULL,   -- last save
            last_used REAL NOT NULL     -- last save or load: the budget drops the oldest
        )"""
    )
    db.execute("CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")


def _migration_2(db: Database) -> None:
    # Chains kept for any request, by its tokens alone (no session name): the disk tier.
    db.execute(
        """CREATE TABLE prefixes (
            head TEXT PRIMARY KEY,      -- the key of the chain's last page
            fingerprint TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            last_used REAL NOT NULL     -- last write or read: the budget drops the oldest
        )"""
    )
    db.execute("CREATE INDEX pages_by_fingerprint ON pages (fingerprint)")


MIGRATIONS = [_migration_1, _migration_2]
SCHEMA_VERSION = len(MIGRATIONS)

# Pages reachable from some session's or prefix's head (UNION: a shared prefix is walked
# once).
LIVE_PAGES = """WITH RECURSIVE live(key) AS (
    SELECT head FROM sessions UNION SELECT head FROM prefixes
    UNION SELECT pages.parent FROM pages JOIN live ON pages.key = live.key
    WHERE pages.parent IS NOT NULL)"""


def page_rows(fingerprint: str, key: str, parent: str | None, page: PageData) -> tuple[dict, dict]:
    """The ``pages`` row (without last_used) and the ``page_data`` row of a new page."""
    tokens = pack_tokens(page.tokens)
    nbytes = len(tokens) + len(page.kv) + len(page.snapshot or b"")
    return (
        {
            "key": key,
            "parent": parent,
            "fingerprint": fingerprint,
            "tokens": tokens,
            "nbytes": nbytes,
            "checksum": page_checksum(tokens, page.kv, page.snapshot),
        },
        {"key": key, "kv": page.kv, "snapshot": page.snapshot},
    )
