"""Reading stored chains: the pages' metadata as walks and the index see them, and
:class:`SessionReader`, which streams a chain's K/V out of a :class:`kvcache.store.DiskStore`
inside one of its read transactions."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from concurrent.futures import wait
from dataclasses import dataclass

from kvcache.store_format import StoredPage, unpack_tokens


@dataclass(frozen=True)
class _Link:
    """A page's metadata, as a chain walk reads it (no K/V)."""

    key: str
    parent: str | None
    tokens: bytes
    nbytes: int
    checksum: str


@dataclass(frozen=True)
class IndexedPage:
    """A stored page as the disk tier's in-memory index holds it (no K/V)."""

    key: str
    parent: str | None
    tokens: bytes  # int32 little-endian, as stored
    has_snapshot: bool


@dataclass(frozen=True)
class ChainPage:
    """A page of a session's chain as the walk sees it (no K/V)."""

    key: str
    tokens: tuple[int, ...]
    has_snapshot: bool


class SessionReader:
    """A session's chain, read inside one read transaction (:meth:`DiskStore.read_session`).

    ``chain`` is the metadata, first page first; :meth:`pages` streams the K/V. While the
    caller works on one page, the next ones are read and checksummed on the store's
    threads (SQLite and CRC-32 release the GIL), so reading overlaps whatever the caller
    does with the bytes, and a page's bytes are dropped as soon as the caller is done with
    them: a restore never holds the whole session twice."""

    READ_AHEAD = 16  # pages in flight beyond the one handed out

    def __init__(self, store, links: list[_Link], suspects: set[str]):
        self._store = store
        self.suspects = suspects  # keys found bad or missing: repaired when the read ends
        self.used: list[ChainPage] = []  # pages handed out, in order
        self._links: list[tuple[_Link, ChainPage]] = []
        self._pending: collections.deque = collections.deque()
        for link in links:
            row = store.db.execute(  # length(): the value itself is not read
                "SELECT length(snapshot) FROM page_data WHERE key = ?", [link.key]
            ).fetchone()
            if row is None:
                suspects.add(link.key)
                break
            self._links.append(
                (link, ChainPage(link.key, unpack_tokens(link.tokens), row[0] is not None))
            )
        self.chain = [page for _, page in self._links]

    def pages(self, count: int | None = None, first: int = 0) -> Iterator[StoredPage]:
        """Pages ``first`` to ``count - 1`` of the chain (None: to the end) with their K/V,
        in order, each verified against its checksum before it is handed out. Stops at
        the first bad or missing page."""
        todo = collections.deque(self._links[first : len(self._links) if count is None else count])
        pending = self._pending
        while todo or pending:
            while todo and len(pending) <= self.READ_AHEAD:
                link, page = todo.popleft()
                pending.append(
                    (
                        link,
                        page,
                        self._store._reader.submit(self._store._fetch, link, page.has_snapshot),
                    )
                )
            link, page, future = pending.popleft()
            data = future.result()
            if data is None or data[2].result() != link.checksum:
                self.suspects.add(link.key)
                return
            self.used.append(page)
            yield StoredPage(link.key, page.tokens, data[0], data[1])

    def close(self) -> None:
        """Wait for the reads in flight (the connection is the store's again after this)."""
        wait([future for _, _, future in self._pending])
        self._pending.clear()
