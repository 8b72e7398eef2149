"""Checking and repairing the disk store: functions over a :class:`~kvcache.store.DiskStore`'s
database (a ``sqlite_utils.Database``), called by the store inside its own read or write
transaction. They find the bad pages (:func:`find_bad_pages`: every page re-hashed), walk a
chain back from its head (:func:`walk`), and cut every session and prefix back to the pages
before its first bad page (:func:`cut_back_chains`); the store then deletes the bad pages
and the orphans, and counts them.

A damaged cache costs time, never a wrong answer: a chain is only ever shortened to pages
that passed their checks, so the engine recomputes the rest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcache.store_format import is_root, page_key, page_problem
from kvcache.store_reader import ChainLink

# a page with its data, as page_problem reads it
_PAGE_ROW = (
    "SELECT p.key, p.parent, p.fingerprint, p.tokens, p.checksum, d.kv, d.snapshot "
    "FROM pages AS p LEFT JOIN page_data AS d ON d.key = p.key"
)


@dataclass(frozen=True)
class VerifyReport:
    pages_checked: int
    bad_pages: int  # failed a check: deleted
    sessions_truncated: int  # cut back to the pages before their first bad one
    sessions_dropped: int  # whose first page was bad, or whose chain could not be walked
    orphans_removed: int

    @property
    def clean(self) -> bool:
        return not (
            self.bad_pages
            or self.sessions_truncated
            or self.sessions_dropped
            or self.orphans_removed
        )


@dataclass(frozen=True)
class ChainsCut:
    """What :func:`cut_back_chains` did: the bad pages still stored (for the store to
    delete), and the sessions and prefixes cut back or dropped."""

    bad: list[str]
    truncated: int
    dropped: int


def find_bad_pages(db) -> tuple[int, set[str]]:
    """Every page re-hashed (inside a read transaction: no write lock while hashing
    everything): how many were checked, and the keys of those that failed a check."""
    suspects: set[str] = set()
    checked = 0
    for row in db.execute(_PAGE_ROW):
        checked += 1
        if page_problem(*row):
            suspects.add(row[0])
    return checked, suspects


def walk(db, head: str, fingerprint: str) -> tuple[list[ChainLink], str | None]:
    """The chain ending at ``head``, head first, and the key where the walk broke
    (missing, another fingerprint, or a key that is not its hash), or None when it reached
    the first page (whose parent is its namespace's root). Reads no K/V."""
    links: list[ChainLink] = []
    seen: set[str] = set()
    key: str | None = head
    while not is_root(key):
        row = db.execute(
            "SELECT parent, fingerprint, tokens, nbytes, checksum FROM pages WHERE key = ?",
            [key],
        ).fetchone()
        if row is None or key in seen or not link_sound(key, row, fingerprint):
            return links, key
        seen.add(key)
        links.append(ChainLink(key, row[0], row[2], row[3], row[4]))
        key = row[0]
    return links, None


def link_sound(key: str, row: tuple, fingerprint: str) -> bool:
    """Whether a page's row (parent, fingerprint, tokens, ...) is the link ``key`` names in
    a chain of ``fingerprint``: that fingerprint, whole int32 tokens, and a key that is the
    hash of its parent and tokens. Reads no K/V."""
    parent, page_fingerprint, tokens = row[0], row[1], row[2]
    return (
        page_fingerprint == fingerprint
        and bool(tokens)
        and not len(tokens) % 4
        and page_key(fingerprint, parent, tokens) == key
    )


def cut_back_chains(db, suspects: set[str], keep_prefix) -> ChainsCut:
    """Inside a write transaction: the suspects that really are bad (re-checked: another
    process may have changed them), every session and prefix cut back to the pages before
    its first bad page (or dropped when nothing of it is left). ``keep_prefix(fingerprint,
    head, tokens, last_used)`` records a prefix cut back (the store's own). The bad pages
    are left for the caller to delete, with the orphans."""
    bad = {key for key in suspects if _stored_page_problem(db, key)}
    truncated = dropped = 0
    for name, fingerprint, head in db.execute(
        "SELECT name, fingerprint, head FROM sessions"
    ).fetchall():
        kept = _sound_part(db, head, fingerprint, bad)
        if kept is None:
            continue
        if not kept:
            db.execute("DELETE FROM sessions WHERE name = ?", [name])
            dropped += 1
            continue
        db.execute(
            "UPDATE sessions SET head = ?, tokens = ?, pages = ?, nbytes = ? WHERE name = ?",
            [
                kept[-1].key,
                chain_tokens(kept),
                len(kept),
                sum(link.nbytes for link in kept),
                name,
            ],
        )
        truncated += 1
    for head, fingerprint, last_used in db.execute(
        "SELECT head, fingerprint, last_used FROM prefixes"
    ).fetchall():
        kept = _sound_part(db, head, fingerprint, bad)
        if kept is None:
            continue
        db.execute("DELETE FROM prefixes WHERE head = ?", [head])
        if not kept:
            dropped += 1
            continue
        keep_prefix(fingerprint, kept[-1].key, chain_tokens(kept), last_used)
        truncated += 1
    stored = [
        key
        for key in sorted(bad)
        if db.execute("SELECT 1 FROM pages WHERE key = ?", [key]).fetchone() is not None
    ]
    return ChainsCut(stored, truncated, dropped)


def chain_tokens(links: Sequence[ChainLink]) -> int:
    """The tokens of a chain of pages (int32 token ids, as stored)."""
    return sum(len(link.tokens) // 4 for link in links)


def _sound_part(db, head: str, fingerprint: str, bad: set[str]) -> list[ChainLink] | None:
    """The chain ending at ``head`` cut back to the pages before its first page in ``bad``,
    first page first: None when the whole chain is sound, [] when nothing of it can be kept
    (its first page is bad, or its walk breaks)."""
    links, broken = walk(db, head, fingerprint)
    if broken is not None:
        return []
    chain = links[::-1]
    keep = next((i for i, link in enumerate(chain) if link.key in bad), len(chain))
    return None if keep == len(chain) else chain[:keep]


def _stored_page_problem(db, key: str) -> str | None:
    row = db.execute(f"{_PAGE_ROW} WHERE p.key = ?", [key]).fetchone()
    return "missing" if row is None else page_problem(*row)
