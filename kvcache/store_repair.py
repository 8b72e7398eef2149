"""Checking and repairing the disk store (:class:`~kvcache.store.DiskStore`'s half that
finds bad pages and cuts chains back): re-hash pages, delete the bad ones, cut every
session and prefix back to the pages before its first bad page, delete orphans.

A damaged cache costs time, never a wrong answer: a chain is only ever shortened to pages
that passed their checks, so the engine recomputes the rest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcache.store_format import is_root, page_key, page_problem
from kvcache.store_reader import ChainLink


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


class StoreRepair:
    """The repair half of :class:`~kvcache.store.DiskStore` (a mixin: it uses the store's
    connection, transactions and page deletion)."""

    def verify(self) -> VerifyReport:
        """Re-hash every page; delete the bad ones, cut each session back to the pages
        before its first bad one (dropping it if that leaves none or its chain cannot be
        walked), delete orphans."""
        suspects: set[str] = set()
        checked = 0
        with self._read():  # no write lock while hashing everything
            for row in self.db.execute(
                "SELECT p.key, p.parent, p.fingerprint, p.tokens, p.checksum, d.kv, d.snapshot "
                "FROM pages AS p LEFT JOIN page_data AS d ON d.key = p.key"
            ):
                checked += 1
                if page_problem(*row):
                    suspects.add(row[0])
        with self._transaction():
            bad, truncated, dropped, orphans = self._repair(suspects)
            strays = self.db.execute(
                "DELETE FROM page_data WHERE key NOT IN (SELECT key FROM pages)"
            ).rowcount
        return VerifyReport(checked, bad, truncated, dropped, orphans + strays)

    # -- inside a transaction --

    def _walk(self, head: str, fingerprint: str) -> tuple[list[ChainLink], str | None]:
        """The chain ending at ``head``, head first, and the key where the walk broke
        (missing, another fingerprint, or a key that is not its hash), or None when it
        reached the first page (whose parent is its namespace's root). Reads no K/V."""
        links: list[ChainLink] = []
        seen: set[str] = set()
        key: str | None = head
        while not is_root(key):
            row = self.db.execute(
                "SELECT parent, fingerprint, tokens, nbytes, checksum FROM pages WHERE key = ?",
                [key],
            ).fetchone()
            if (
                row is None
                or key in seen
                or row[1] != fingerprint
                or not row[2]
                or len(row[2]) % 4
                or page_key(fingerprint, row[0], row[2]) != key
            ):
                return links, key
            seen.add(key)
            links.append(ChainLink(key, row[0], row[2], row[3], row[4]))
            key = row[0]
        return links, None

    def _repair(self, suspects: set[str]) -> tuple[int, int, int, int]:
        """Delete the suspects that really are bad (re-checked: another process may have
        changed them), cut every session and prefix back to the pages before its first bad
        page, delete orphans. Returns (bad pages, chains truncated, dropped, orphans)."""
        bad = {key for key in suspects if self._stored_page_problem(key)}
        truncated = dropped = 0
        for name, fingerprint, head in self.db.execute(
            "SELECT name, fingerprint, head FROM sessions"
        ).fetchall():
            kept = self._sound_part(head, fingerprint, bad)
            if kept is None:
                continue
            if not kept:
                self.db.execute("DELETE FROM sessions WHERE name = ?", [name])
                dropped += 1
                continue
            self.db.execute(
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
        for head, fingerprint, last_used in self.db.execute(
            "SELECT head, fingerprint, last_used FROM prefixes"
        ).fetchall():
            kept = self._sound_part(head, fingerprint, bad)
            if kept is None:
                continue
            self.db.execute("DELETE FROM prefixes WHERE head = ?", [head])
            if not kept:
                dropped += 1
                continue
            self._keep_prefix(fingerprint, kept[-1].key, chain_tokens(kept), last_used)
            truncated += 1
        existing = [key for key in bad if self._page_sizes([key])]
        self._delete_pages(existing)
        self._count(dropped_pages=len(existing))
        return len(existing), truncated, dropped, self._delete_orphans()[0]

    def _sound_part(self, head: str, fingerprint: str, bad: set[str]) -> list[ChainLink] | None:
        """The chain ending at ``head`` cut back to the pages before its first page in
        ``bad``, first page first: None when the whole chain is sound, [] when nothing of it
        can be kept (its first page is bad, or its walk breaks)."""
        links, broken = self._walk(head, fingerprint)
        if broken is not None:
            return []
        chain = links[::-1]
        keep = next((i for i, link in enumerate(chain) if link.key in bad), len(chain))
        return None if keep == len(chain) else chain[:keep]

    def _stored_page_problem(self, key: str) -> str | None:
        row = self.db.execute(
            "SELECT p.key, p.parent, p.fingerprint, p.tokens, p.checksum, d.kv, d.snapshot "
            "FROM pages AS p LEFT JOIN page_data AS d ON d.key = p.key WHERE p.key = ?",
            [key],
        ).fetchone()
        return "missing" if row is None else page_problem(*row)


def chain_tokens(links: Sequence[ChainLink]) -> int:
    """The tokens of a chain of pages (int32 token ids, as stored)."""
    return sum(len(link.tokens) // 4 for link in links)
