"""What the disk holds for the loaded model, in memory: find a prompt's stored pages by
its tokens without touching the database.

The store's pages are content addressed (``key = hash(fingerprint, parent key,
tokens)``), so the same tokens after the same parent are the same page whoever wrote
them -- inside one cache namespace, whose root is the parent of its chains' first pages.
The index maps each parent to its children, grouped by their first token; a lookup
walks the prompt from its namespace's root (never reaching another's pages), one dict
lookup and one bytes comparison per page, and re-derives each key it follows from the
tokens (a stale or damaged entry never leads to a wrong page). A miss costs one dict lookup: no
K/V read, no query.

Built once when a model loads (:meth:`DiskStore.index`, metadata only) and kept current
by the cache writer thread (pages written, pages deleted); read by the engine thread.
The two meet under one lock. Another process's writes are not seen until the next load;
its deletes show up as missing pages when a read reaches them.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterable, Sequence

from kvcache.store import ChainPage, IndexedPage
from kvcache.store_format import namespace_root, page_key, unpack_tokens


class DiskIndex:
    """The stored pages of one model fingerprint: key -> page, parent -> children."""

    def __init__(self, fingerprint: str, pages: Iterable[IndexedPage] = ()):
        self.fingerprint = fingerprint
        self._lock = threading.Lock()
        self._pages: dict[str, IndexedPage] = {}
        # parent key (a namespace's root: a first page) -> first token's bytes -> the children
        # starting so
        self._children: dict[str | None, dict[bytes, list[IndexedPage]]] = {}
        self.add(pages)

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, key: str) -> bool:
        return key in self._pages

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._pages)

    def has_snapshot(self, key: str) -> bool:
        page = self._pages.get(key)
        return page is not None and page.has_snapshot

    def add(self, pages: Iterable[IndexedPage]) -> None:
        with self._lock:
            for page in pages:
                if page.key in self._pages:  # stored once: its first writer's snapshot flag
                    continue
                self._pages[page.key] = page
                self._children.setdefault(page.parent, {}).setdefault(page.tokens[:4], []).append(
                    page
                )

    def discard(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                page = self._pages.pop(key, None)
                if page is not None:
                    self._unlink(page)

    def _unlink(self, page: IndexedPage) -> None:
        groups = self._children.get(page.parent, {})
        siblings = groups.get(page.tokens[:4], [])
        siblings[:] = [p for p in siblings if p.key != page.key]
        if not siblings:
            groups.pop(page.tokens[:4], None)
        if not groups:
            self._children.pop(page.parent, None)

    def match(self, prompt: Sequence[int], namespace: str = "") -> list[ChainPage]:
        """The stored chain of ``namespace`` that follows ``prompt`` furthest, first page first:
        every page whose tokens are the prompt's at its place, then (where the walk stops) the
        child sharing the longest run of tokens with the rest of the prompt, if any (a
        token-exact model can use part of it). Prefers the longer page where several match. []
        when the disk holds nothing of the prompt."""
        blob = struct.pack(f"<{len(prompt)}i", *prompt)
        chain: list[ChainPage] = []
        parent: str | None = namespace_root(namespace)
        at = 0
        with self._lock:
            while at < len(blob):
                siblings = self._children.get(parent, {}).get(blob[at : at + 4], ())
                full = [
                    p
                    for p in siblings
                    if blob[at : at + len(p.tokens)] == p.tokens
                    and page_key(self.fingerprint, parent, p.tokens) == p.key
                ]
                if full:
                    page = max(full, key=lambda p: len(p.tokens))
                    chain.append(ChainPage(page.key, unpack_tokens(page.tokens), page.has_snapshot))
                    parent, at = page.key, at + len(page.tokens)
                    continue
                partial = max(
                    siblings, key=lambda p: _common_bytes(p.tokens, blob[at:]), default=None
                )
                if (
                    partial is not None
                    and page_key(self.fingerprint, parent, partial.tokens) == partial.key
                ):
                    chain.append(
                        ChainPage(partial.key, unpack_tokens(partial.tokens), partial.has_snapshot)
                    )
                break
        return chain


def _common_bytes(a: bytes, b: bytes) -> int:
    return len(os.path.commonprefix([a, b])) // 4
