"""The engine's view of the KV cache: match a prompt, build mlx-lm caches, store results.

One :class:`PrefixCache` per loaded model, used by the engine thread only::

    prefix = cache.match(prompt, namespace="app")  # longest cached prefix, locked
    caches = cache.make_caches(prefix)             # mlx-lm cache objects holding it
    ...prefill prompt[prefix.length:], decode...  # snapshots at chosen boundaries
    cache.commit(prefix, tokens, caches, snapshots, session="chat-1")  # in the prefix's namespace

Full-attention K/V lives in the page pool (one slot per token); the radix tree maps
token sequences to slots. Layers the pool can't rebuild (sliding window, recurrent) come
back from snapshots taken at node ends; for such hybrid models a match is cut back to
the deepest node holding one. Sessions keep a lock on their conversation's frontier so
their pages are evicted only after anonymous ones.

Namespaces: a request's prefix is matched and stored in its namespace only (the
tree's), and sessions and hot caches are kept per namespace too, so nothing one
namespace cached ever serves another; the pool and its eviction are shared.
"""

from __future__ import annotations

import itertools
import logging
import math
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from kvcache.builder import KVCacheBuildResult
from kvcache.kv_pages import (
    cache_holding,
    formats_by_kind,
    fresh_caches,
    is_paged_cache,
    tokens_of,
    with_batch,
    without_batch,
)
from kvcache.layout import CachePath, cache_at, put_cache
from kvcache.radix_cache import TreeNode
from kvcache.snapshot import Snapshot, take_snapshot
from kvcache.stats import CacheStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prefix:
    """A matched, locked prefix of a prompt."""

    length: int
    slots: tuple[int, ...]
    node: TreeNode
    snapshot: Snapshot | None
    tokens: tuple[int, ...]  # the matched tokens
    namespace: str = ""  # where it was matched, and where its commit stores
    restored: int = 0  # of ``length``, the tokens read from disk for this match


def cache_source(caches: list, paged: tuple[CachePath, ...]):
    """K/V of tokens ``a..b`` of pool layer ``i`` (the cache at ``paged[i]``) from a
    request's mlx-lm caches."""

    def source(pool_index: int, a: int, b: int):
        kv = cache_at(caches, paged[pool_index])  # (1, heads, capacity, dim) K and V, or
        assert kv.offset >= b, f"cache {paged[pool_index]} holds {kv.offset} < {b} tokens"
        return tokens_of(kv.keys, a, b, batch=True), tokens_of(kv.values, a, b, batch=True)

    return source


HOT_ENTRIES = 2  # recent requests whose mlx-lm cache objects are kept for a follow-up


class PrefixCache:
    """The KV cache of one loaded model, as the engine uses it: the page pool, its
    allocator and the radix tree, held together by one rule set.

    What it holds: the builder's pool (full-attention K/V, ``page_size`` tokens per
    page, page 0 the null page), the page allocator (a free list and a reference count
    per page), the :class:`~kvcache.radix_cache.RadixCache` over token ids whose values
    are slots ``page * page_size + offset`` (negative placeholders for a model with no
    full-attention layer); the session table (session name -> the tree node ending its
    conversation, least recently used first); up to ``HOT_ENTRIES`` recent requests'
    own mlx-lm cache objects; and restored K/V waiting to be copied into the pool.
    Sessions and hot entries are keyed by namespace too.

    Who owns what:

    - Threads: the engine thread alone calls it (no lock inside). Other threads see
      only :meth:`stats`' plain values, passed on by the engine; the disk writer thread
      (``kvcache.persist``) gets bytes, never this object.
    - Pages: a page's reference count is the number of tree slots on it; a page is
      free when the count reaches 0. The tree frees its slots through ``on_free``; a
      commit frees the slots of a new suffix the tree already held (duplicates).
    - Locks: every :class:`Prefix` from :meth:`match` (or ``insert_restored``) holds
      one tree lock on its node until :meth:`commit` or :meth:`release` (each gives it
      back once). Every session holds one lock on its frontier node, moved on each
      commit, dropped by :meth:`forget_session` or, oldest first, when eviction alone
      cannot find room: anonymous pages go before a session's.
    - Hot caches: an entry's arrays are the request's own; a request that extends one
      takes it (and the entry leaves the table), no copy.

    Invariants:

    - The tree's protected size is exactly the tokens on the paths from the root to
      the nodes of open prefixes and sessions; with no request open,
      ``stats().pages_locked`` counts only the sessions' pages.
    - A match never covers the whole prompt: the last prompt token is always computed,
      for its logits.
    - Hybrid models: a node is a resume point only if it ends with a snapshot of the
      sliding-window / recurrent layers, taken after exactly the tokens up to its end;
      a commit stores tokens only up to the last snapshot it was given.
    - Restored pages wait in ``_pending_writes`` only until the next allocation, gather
      or admitted request (:meth:`flush_writes`): nothing reads a page before its K/V
      is in it, and no page is reused while its K/V is pending.
    """

    def __init__(self, model, build: KVCacheBuildResult, write_back=None):
        self.model = model
        self.build = build
        self.tree = build.tree
        self.pool = build.pool
        self.allocator = build.allocator
        self.page_size = build.page_size
        layout = build.layout
        # paths in the model's cache list (kvcache.layout): snapshotted, and paged in pool order
        self._snapshot_paths = tuple(s.path for s in layout.snapshotted) if layout else ()
        self.paged = tuple(s.path for s in layout.paged) if layout else ()
        self._paged_specs = layout.paged if layout else ()
        self.layout = layout
        self.hybrid = bool(self._snapshot_paths)
        # (namespace, session name) -> its frontier; LRU order, oldest first
        self._sessions: OrderedDict[tuple[str, str], TreeNode] = OrderedDict()
        self._prompt_tokens = 0
        self._evicted_pages = 0
        # (namespace, tokens), LRU
        self._hot: OrderedDict[tuple[str, tuple[int, ...]], list] = OrderedDict()
        self._placeholders = itertools.count(1)  # slot stand-ins when nothing is paged
        self._open: set[int] = set()  # id() of prefixes matched and not yet committed/released
        self._pending_writes: list[tuple] = []  # restored K/V not yet in the pool (flush_writes)
        # The lower tier's hook (kvcache.tiered): called with an evicted leaf's whole path
        # (tokens, a source of their K/V, the snapshots at its end, its namespace) before
        # its pages go; None: nothing below RAM.
        self.write_back = write_back
        # weakly: the tree is this cache's own, so a strong hook would make a cycle that keeps
        # the model (and its weights) alive after a model switch until the cyclic GC runs
        evicting = weakref.WeakMethod(self._evicting)
        self.tree.on_evict = lambda node: _call_if_alive(evicting, node)

    @property
    def enabled(self) -> bool:
        return not self.build.disable_radix_cache

    # ----------------------------------------------------------- request path
    def match(self, prompt: list[int], namespace: str = "", restored: int = 0) -> Prefix:
        """The longest usable prefix of ``prompt`` cached in ``namespace`` (never all of it:
        the last prompt token is always computed, for its logits). Locked until
        commit/release. ``restored``: tokens a lower tier just put in RAM for it (recorded
        on the prefix, up to its length)."""
        self._prompt_tokens += len(prompt)
        result = self.tree.match_prefix(prompt[:-1], namespace)
        self.tree.inc_lock_ref(result.last_node)
        prefix = Prefix(
            result.length,
            result.values,
            result.last_node,
            result.snapshot,
            tuple(prompt[: result.length]),
            namespace,
            min(restored, result.length),
        )
        self._open.add(id(prefix))
        return prefix

    def make_caches(self, prefix: Prefix, room: int = 0) -> list:
        """mlx-lm cache objects holding the prefix: pooled K/V gathered, snapshots restored.

        The last requests' own cache objects are kept a while ("hot"): a follow-up that
        extends one of them takes it as is (trimmed to the prefix when every layer is a
        plain KVCache), skipping the gather. Same values as the pool, no copy.

        A gathered ``KVCache`` gets room for at least ``room`` more tokens (the rest of
        the prompt) in the same buffer, rounded up to mlx-lm's allocation step: the
        slots past the prefix read the null page, and the prefill writes over them in
        place instead of copying the whole cache into a bigger one.
        """
        if prefix.length == 0:
            return self.fresh_caches()
        hot = self._take_hot(prefix)
        if hot is not None:
            return hot
        self.flush_writes()
        caches = self.fresh_caches()
        if prefix.snapshot is not None:
            prefix.snapshot.restore_into(caches)
        if not self.paged:
            return caches
        step = KVCache.step
        capacity = step * -(-(prefix.length + max(room, 1)) // step)
        slots = mx.array(prefix.slots + (0,) * (capacity - prefix.length), dtype=mx.int32)
        for pool_index, spec in enumerate(self._paged_specs):
            keys, values = self.pool.gather(pool_index, slots)
            put_cache(caches, spec.path, cache_holding(spec, keys, values, prefix.length))
        return caches

    def fresh_caches(self) -> list:
        """A request's empty caches, the paged ones in the pool's KV format."""
        return fresh_caches(self.model, self.layout)

    def snapshot(self, caches: list, length: int) -> Snapshot | None:
        """The non-paged caches' state after ``length`` tokens (None for plain models)."""
        if not self.hybrid or not self.enabled:
            return None
        return take_snapshot(caches, self._snapshot_paths, length)

    def commit(
        self,
        prefix: Prefix,
        tokens: list[int],
        caches: list,
        snapshots: list[Snapshot] = (),
        session: str | None = None,
    ) -> int:
        """Store ``tokens`` (everything ``caches`` holds) in the tree, in the prefix's
        namespace, and release the prefix. Returns how many new tokens went into the pool."""
        try:
            if not self.enabled:
                return 0
            held = len(tokens)  # what the caches hold
            if self.hybrid:  # nothing past the last snapshot can be resumed from
                snapshots = [s for s in snapshots if prefix.length < s.length <= len(tokens)]
                if not snapshots:
                    return 0
                tokens = tokens[: max(s.length for s in snapshots)]
            stored = self._store(prefix, tokens, cache_source(caches, self.paged), snapshots)
            if session is not None and stored is not None:
                self._move_session(session, tokens, prefix.namespace)
            if stored is not None and len(tokens) == held:
                self._keep_hot(tokens, caches, prefix.namespace)
            return stored or 0
        finally:
            self.release(prefix)

    def release(self, prefix: Prefix) -> None:
        """Give the prefix's lock back (after commit, or instead of it: cancel, error).
        Releasing twice is a no-op."""
        if id(prefix) in self._open:
            self._open.discard(id(prefix))
            self.tree.dec_lock_ref(prefix.node)

    def forget_session(self, session: str, namespace: str = "") -> None:
        node = self._sessions.pop((namespace, session), None)
        if node is not None:
            self.tree.dec_lock_ref(node)

    # ----------------------------------------------------------- internals
    def insert_restored(
        self,
        tokens: list[int],
        start: int,
        layers_kv: list,
        snapshot: Snapshot | None,
        namespace: str = "",
    ) -> int:
        """Put K/V restored from disk for ``tokens[start:]`` into the pool and the tree
        (in ``namespace``, the one the disk chain belongs to).

        ``layers_kv[i]`` is ``(keys, values)`` of paged cache ``i`` (pool order),
        each ``(heads, m, dim)`` with ``m >= len(tokens)``: the K/V of the whole
        sequence, position by position (the first ``start`` as RAM holds them, see
        :meth:`cached_kv`; then the restored tokens), the rest spare room.
        ``tokens[:start]`` must already be cached. Returns the tokens now cached beyond
        ``start`` (0 if the pool is full).

        The same arrays also become the mlx-lm cache objects of a hot entry: the request
        that asked for the restore takes them without gathering its prefix back out of
        the pool, and its prefill fills the spare room in place. The copy of the restored
        tokens into the pool waits (see :meth:`flush_writes`) until that request has its
        first token, or until anything allocates from or gathers out of the pool,
        whichever comes first: the tree holds the pages, and nothing reads them before.
        """
        prefix = self.match(list(tokens) + [0], namespace)  # locks tokens[:start] while we allocate
        try:
            if not self.enabled or prefix.length < start:
                return 0

            snapshots = [snapshot] if snapshot is not None else []
            if self.hybrid and not snapshots:
                return 0
            # The pool copy reads the hot caches when it runs: the request's prefill updates
            # them in place meanwhile (only past len(tokens)); a reference held to the
            # arrays themselves would make that update copy every layer instead.
            caches = self._restored_caches(len(tokens), layers_kv, snapshot)
            stored = (
                self._store(
                    prefix, list(tokens), cache_source(caches, self.paged), snapshots, defer=True
                )
                or 0
            )
            if stored:
                self._keep_hot(list(tokens), caches, namespace)
            return stored
        finally:
            self.release(prefix)
            self._prompt_tokens -= len(tokens) + 1  # not a prompt: keep the hit rate honest

    def _restored_caches(self, length: int, layers_kv: list, snapshot: Snapshot | None) -> list:
        caches = self.fresh_caches()
        if snapshot is not None:
            snapshot.restore_into(caches)
        for (keys, values), spec in zip(layers_kv, self._paged_specs):
            kv = cache_holding(spec, with_batch(keys), with_batch(values), length)
            put_cache(caches, spec.path, kv)
        return caches

    def _evicting(self, node: TreeNode) -> None:
        """A leaf is about to be evicted (its slots still hold its K/V): hand its path
        from the root to the lower tier, which writes what it does not have yet."""
        if self.write_back is None:
            return
        namespace = self.tree.namespace_of(node)
        path = []
        while node is not None and node.key:  # up to its namespace's top
            path.append(node)
            node = node.parent
        path.reverse()
        tokens = [t for n in path for t in n.key]
        slots = [s for n in path for s in n.value]
        pool = self.pool

        def source(pool_index: int, a: int, b: int):
            keys, values = pool.gather(pool_index, slots[a:b])
            return without_batch(keys), without_batch(values)

        snapshot = path[-1].snapshot if path else None
        try:
            self.write_back(tokens, source, [snapshot] if snapshot is not None else [], namespace)
        except Exception:  # the prefix is recomputed when it is asked for again, no more
            log.exception("writing back an evicted prefix failed")

    def cached_kv(self, tokens: list[int], namespace: str = "") -> list[tuple[mx.array, mx.array]]:
        """The K/V RAM holds for ``tokens`` in ``namespace`` (all cached: see
        :meth:`cached_length`), as ``(keys, values)`` per paged cache (pool
        order), each ``(heads, n, dim)``, evaluated: what a restore puts before the
        tokens it reads from disk. No locks, no counters."""
        slots = self.tree.peek_values(tokens, namespace)
        if len(slots) != len(tokens):
            raise ValueError(f"RAM holds {len(slots)} of the {len(tokens)} tokens asked for")
        self.flush_writes()  # restored K/V still on its way into these pages
        layers = []
        for pool_index in range(len(self.paged)):
            keys, values = self.pool.gather(pool_index, slots)
            layers.append((without_batch(keys), without_batch(values)))
        return layers

    def cached_length(self, tokens: list[int], namespace: str = "") -> int:
        """How much of ``tokens`` a request in ``namespace`` would get from RAM now (no
        locks, no counters)."""
        return self.tree.peek_length(tokens, namespace)

    def flush_writes(self) -> None:
        """Copy restored K/V into the pool pages the tree already gave them (the engine
        calls this once a request is admitted; any allocation or gather calls it first)."""
        pending, self._pending_writes = self._pending_writes, []
        for pool_index, pages, source, a, b in pending:
            self.pool.write(pool_index, pages, *source(pool_index, a, b))

    def _store(
        self, prefix: Prefix, tokens: list[int], source, snapshots, defer: bool = False
    ) -> int | None:
        new = len(tokens) - prefix.length
        if new <= 0:
            return 0
        if not self.paged:  # pure recurrent: nothing to page, snapshots carry it all
            return self._insert(
                prefix, tokens, [-next(self._placeholders) for _ in range(new)], snapshots
            )
        pages = self._alloc(math.ceil(new / self.page_size))
        if pages is None:
            return None
        try:
            for pool_index in range(len(self.paged)):
                if defer:
                    self._pending_writes.append(
                        (pool_index, pages, source, prefix.length, len(tokens))
                    )
                else:
                    self.pool.write(
                        pool_index, pages, *source(pool_index, prefix.length, len(tokens))
                    )
        except BaseException:  # out of memory...: the pages go back, not lost to the pool
            self.allocator.decref(pages)
            raise
        new_slots = [page * self.page_size + i for page in pages for i in range(self.page_size)][
            :new
        ]
        # The allocator counts one reference per slot the tree holds; alloc gave one per page.
        self.allocator.incref(
            [slot // self.page_size for slot in new_slots if slot % self.page_size]
        )
        return self._insert(prefix, tokens, new_slots, snapshots)

    def _insert(self, prefix: Prefix, tokens: list[int], new_slots: list[int], snapshots) -> int:
        values = tuple(prefix.slots) + tuple(new_slots)
        by_end = {s.length: s for s in snapshots}
        if not self.hybrid:
            by_end.setdefault(len(tokens), None)
        owned = prefix.length  # values[:owned] are settled: the tree's, or freed duplicates
        for end in sorted(by_end):
            already = self.tree.insert(tokens[:end], values[:end], by_end[end], prefix.namespace)
            self._free_slots(values[owned:already])  # the tree kept its own slots for these
            owned = end
        return len(new_slots)

    def _alloc(self, num_pages: int) -> list[int] | None:
        self.flush_writes()  # pages waiting for their K/V must not be evicted and reused first
        if num_pages > self.allocator.num_pages:  # can never fit: don't evict for nothing
            return None
        pages = self.allocator.alloc(num_pages)
        while pages is None:
            if self.pool is not None and self.allocator.reserved < self.allocator.num_pages:
                self.allocator.add_pages(self.pool.grow())  # RAM on demand, before evicting
                pages = self.allocator.alloc(num_pages)
                continue
            needed = (num_pages - self.allocator.available()) * self.page_size
            free_before = self.allocator.free_pages
            evicted = self.tree.evict(needed)
            self._evicted_pages += self.allocator.free_pages - free_before
            if evicted == 0 and not self._drop_oldest_session():
                return None
            pages = self.allocator.alloc(num_pages)
        return pages

    def _drop_oldest_session(self) -> bool:
        if not self._sessions:
            return False
        _, node = self._sessions.popitem(last=False)
        self.tree.dec_lock_ref(node)
        return True

    def _move_session(self, session: str, tokens: list[int], namespace: str) -> None:
        node = self.tree.node_at(tokens, namespace)
        if node is None:
            return
        self.tree.inc_lock_ref(node)
        self.forget_session(session, namespace)
        self._sessions[namespace, session] = node

    def _keep_hot(self, tokens: list[int], caches: list, namespace: str) -> None:
        if all(
            getattr(cache_at(caches, path), "offset", None) == len(tokens) for path in self.paged
        ):
            self._hot[namespace, tuple(tokens)] = caches
            while len(self._hot) > HOT_ENTRIES:
                self._hot.popitem(last=False)

    def _take_hot(self, prefix: Prefix) -> list | None:
        for (namespace, tokens), caches in reversed(self._hot.items()):
            if (
                namespace != prefix.namespace
                or len(tokens) < prefix.length
                or tokens[: prefix.length] != prefix.tokens
            ):
                continue
            excess = len(tokens) - prefix.length
            if excess and not all(is_paged_cache(c) for c in caches):
                continue  # sliding / recurrent state can't be cut back: gather instead
            del self._hot[namespace, tokens]
            if excess:
                for cache in caches:
                    cache.trim(excess)
            return caches
        return None

    def _free_slots(self, slots) -> None:
        pages = [slot // self.page_size for slot in slots if slot >= 0]  # < 0: placeholders
        if pages:
            self.allocator.decref(pages)

    def stats(self) -> CacheStats:
        tree = self.tree.stats()
        evictable_pages, locked_pages, snapshots, snapshot_bytes = self._page_census()
        return CacheStats(
            enabled=self.enabled,
            disabled_reason=self.build.disable_reason,
            page_size=self.page_size,
            pages_total=self.allocator.num_pages,
            pages_used=self.allocator.used_pages,
            pages_evictable=evictable_pages,
            pages_locked=locked_pages,
            pool_bytes=self.pool.nbytes if self.pool is not None else 0,
            pages_reserved=self.allocator.reserved,
            pool_budget_bytes=self.pool.budget_bytes if self.pool is not None else 0,
            tree_nodes=tree.nodes,
            tree_tokens=tree.evictable_tokens + tree.protected_tokens,
            snapshots=snapshots,
            snapshot_bytes=snapshot_bytes,
            hits=tree.hits,
            misses=tree.misses,
            hit_tokens=tree.cached_tokens,
            prompt_tokens=self._prompt_tokens,
            evicted_tokens=tree.evicted_tokens,
            evicted_pages=self._evicted_pages,
            sessions=len(self._sessions),
            namespaces=tree.namespaces,
            cached_as=self.build.layout.cached_as if self.enabled else "",
            layout=self.build.layout.describe() if self.build.layout is not None else "",
            kv_formats=tuple(formats_by_kind(self.build.layout).items()),
        )

    def _page_census(self) -> tuple[int, int, int, int]:
        locked: set[int] = set()
        evictable: set[int] = set()
        snapshots = snapshot_bytes = 0
        for node in self.tree.nodes():
            pages = {slot // self.page_size for slot in node.value}
            (locked if node.lock_ref > 0 else evictable).update(pages)
            if node.snapshot is not None:
                snapshots += 1
                snapshot_bytes += node.snapshot.nbytes
        return len(evictable - locked), len(locked), snapshots, snapshot_bytes


def _call_if_alive(method: weakref.WeakMethod, node: TreeNode) -> None:
    bound = method()
    if bound is not None:
        bound(node)
