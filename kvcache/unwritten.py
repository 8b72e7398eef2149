"""Pages handed to the disk writer and not yet written: read back from memory meanwhile.

The disk tier's writer thread runs at the lowest CPU priority (``kvcache.priority``), so on
a busy machine it may write a page long after the engine handed it over: when a request
ended, or when RAM evicted its prefix (write-back). Until then the page was invisible to
restores, which look pages up in the index of what is written: a prefix evicted from RAM
came back as a recompute, not a read (issue 42.6: the pressure bench restored nothing
while other work loaded the machine). The page's bytes are in memory all that time, in
the writer's queue; :class:`UnwrittenPages` lets a restore read them from there.

So the disk tier indexes a page as soon as it is handed over (its index entry is what a
written page's would be), keeps its bytes here until the writer is done with it, and a
read of a chain takes its written pages from the store and the rest from here
(:func:`read_chain`). A write that fails takes the pages out of the index again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from kvcache.store import ChainPage, DiskStore, PageData
from kvcache.store_format import StoredPage


class UnwrittenPages:
    """key -> the bytes of a page the writer has not written yet (any thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pages: dict[str, PageData] = {}

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, key: str) -> bool:
        return key in self._pages

    def add(self, keys: Sequence[str], pages: Sequence[PageData]) -> None:
        """The pages of a save handed to the writer (those with bytes: the others are
        written already, or on their way in another save)."""
        with self._lock:
            for key, page in zip(keys, pages):
                if page.kv is not None:
                    self._pages[key] = page

    def discard(self, keys: Iterable[str]) -> None:
        """The writer is done with these (written, or failed)."""
        with self._lock:
            for key in keys:
                self._pages.pop(key, None)

    def keys(self) -> set[str]:
        with self._lock:
            return set(self._pages)

    def get(self, key: str) -> PageData | None:
        with self._lock:
            return self._pages.get(key)


class ChainReading:
    """A chain being read: its first pages from the store (``written``, a
    :class:`kvcache.store_reader.SessionReader`, or None), the rest from memory. What a
    restore needs of a reader: ``chain``, :meth:`pages`, ``used``, ``suspects``,
    ``missing``."""

    def __init__(self, written, asked: int, unwritten: list[tuple[ChainPage, PageData]]):
        self._written = written
        on_disk = written.chain if written is not None else []
        # the unwritten pages follow the written ones only where all ``asked`` of them are there
        self._unwritten = unwritten if len(on_disk) == asked else []
        self.chain = [*on_disk, *(page for page, _ in self._unwritten)]
        self._used: list[ChainPage] = []
        self.suspects: set[str] = written.suspects if written is not None else set()
        self.missing: set[str] = written.missing if written is not None else set()

    @property
    def used(self) -> list[ChainPage]:
        return [*(self._written.used if self._written is not None else []), *self._used]

    def pages(self, count: int | None = None, first: int = 0) -> Iterator[StoredPage]:
        """Pages ``first`` to ``count - 1`` of the chain with their K/V, in order; stops at
        the first written page that fails its check (nothing after it is handed out)."""
        end = len(self.chain) if count is None else min(count, len(self.chain))
        on_disk = len(self.chain) - len(self._unwritten)
        if first < on_disk:
            handed = 0
            for page in self._written.pages(min(end, on_disk), first):
                handed += 1
                yield page
            if handed < min(end, on_disk) - first:
                return  # a bad page: what follows it is not read
        for page, data in self._unwritten[max(0, first - on_disk) : max(0, end - on_disk)]:
            self._used.append(page)
            yield StoredPage(page.key, page.tokens, data.kv, data.snapshot)


@contextmanager
def read_chain(
    store: DiskStore,
    fingerprint: str,
    chain: Sequence[ChainPage],
    namespace: str,
    unwritten: UnwrittenPages,
) -> Iterator[ChainReading]:
    """Read ``chain`` (found in the index by a prompt's tokens): its pages up to the first
    one still on its way to disk from the store (one read transaction, as
    :meth:`DiskStore.read_chain`), the pages on their way after it from memory (up to the
    first that is neither: the chain stops there)."""
    split = next((i for i, page in enumerate(chain) if page.key in unwritten), len(chain))
    tail: list[tuple[ChainPage, PageData]] = []
    for page in chain[split:]:
        data = unwritten.get(page.key)
        if data is None:
            break
        tail.append((page, data))
    if split == 0:
        yield ChainReading(None, 0, tail)
        return
    keys = [page.key for page in chain[:split]]
    with store.read_chain(fingerprint, keys, namespace) as written:
        yield ChainReading(written, split, tail)
