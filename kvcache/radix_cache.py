"""Radix tree over token ids: which prompt prefixes have KV cached, and where.

Keys are token ids (token-exact, so a conversation's partial last page is reused
too); values are opaque ints, one per token (a KV slot: ``page_id * page_size +
offset``). The tree never interprets a value. The storage that owns the slots
(the page allocator) hears from the tree only through ``on_free(values)``, called
when the tree releases slots (eviction, ``reset``, a disabled cache); with
``on_free=None`` the tree is pool-less, which is how the tests drive it.

Ownership of values, over the life of a tree: every value handed to ``insert``
for the new suffix is owned by the tree until it passes through ``on_free``
exactly once. Values for the prefix that was already cached stay the caller's
(``insert`` returns that prefix length so the caller frees its duplicates).

Locks: ``inc_lock_ref(node)`` pins the path root..node; a node with
``lock_ref > 0`` is never evicted. Typical use::

    m = cache.match_prefix(tokens); cache.inc_lock_ref(m.last_node)
    ...prefill/decode from m.length...
    cache.insert(tokens + new_tokens, slots, snapshot=...)   # free slots[:returned]
    cache.dec_lock_ref(m.last_node)

A node returned by ``match_prefix`` stays valid while locked: splits keep the
original node object as the lower part (it still ends at the same token), and
the tree never merges nodes. Lock it before anything can evict. Not
thread-safe: one thread (the engine's) owns the tree; ``on_free`` must not call
back into it.

Hybrid models (sliding-window or recurrent layers) pass ``require_snapshots``:
a node end is a resume point only if it holds a snapshot of the state that
per-token KV cannot rebuild, and ``match_prefix`` cuts back to the deepest one.

Namespaces: every call takes a ``namespace`` (a string; ``""`` by default). Each
namespace has its own top node, so a prefix is only ever matched inside the namespace
that inserted it: the same tokens in two namespaces are two paths, two sets of
slots. Namespace ``""`` hangs off the root itself; any other one off an anchor (an
empty node below the root, made by its first insert and dropped with its last node).
Eviction stays one LRU over every namespace: the pool is shared, its contents are not.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

OnFree = Callable[[tuple[int, ...]], None]


class TreeNode:
    """One edge of the tree: ``key`` tokens and their ``value`` slots, ending at this node."""

    __slots__ = (
        "children",
        "parent",
        "key",
        "value",
        "lock_ref",
        "last_access",
        "snapshot",
        "serial",
        "namespace",
    )

    def __init__(
        self, key: tuple[int, ...], value: tuple[int, ...], parent: TreeNode | None, serial: int
    ):
        self.children: dict[int, TreeNode] = {}  # keyed by the child's first token
        self.parent = parent  # None for the root and for nodes no longer in the tree
        self.key = key
        self.value = value
        self.lock_ref = 0  # locks held on this node or any descendant (see inc_lock_ref)
        self.last_access = 0  # tick of the LRU clock, not wall time
        self.snapshot: object | None = None  # state at the END of this edge (hybrid models)
        self.serial = serial  # creation order: a deterministic tie-break for eviction
        self.namespace: str | None = None  # set on a namespace's top node only (root or anchor)

    def __repr__(self) -> str:
        return (
            f"TreeNode(key={self.key[:8]}{'...' if len(self.key) > 8 else ''}, "
            f"lock_ref={self.lock_ref})"
        )


@dataclass(frozen=True)
class MatchResult:
    values: tuple[int, ...]  # slot per matched token
    length: int  # tokens matched (== len(values))
    last_node: TreeNode  # the match ends exactly at this node's end (split if needed)
    snapshot: object | None  # last_node's snapshot (None at the root or when absent)


@dataclass(frozen=True)
class RadixStats:
    hits: int  # matches of at least one token
    misses: int  # matches of zero tokens
    cached_tokens: int  # sum of matched lengths
    evicted_tokens: int
    evicted_nodes: int
    nodes: int  # nodes other than the root and the namespace anchors
    evictable_tokens: int
    protected_tokens: int
    namespaces: int = 0  # namespaces holding at least one node


def _common_len(key: tuple[int, ...], tokens: tuple[int, ...], start: int) -> int:
    """How many leading tokens of ``key`` equal ``tokens[start:]``."""
    n = min(len(key), len(tokens) - start)
    i = 0
    while i < n and key[i] == tokens[start + i]:
        i += 1
    return i


class RadixCache:
    """Which token prefixes have cached KV, and in which slots: a radix tree, token-exact.

    What it holds: ``root`` (empty key and value, ``lock_ref`` pinned at 1, never
    evicted, never holds a snapshot) and below it :class:`TreeNode` edges; each edge's
    ``key`` is a run of token ids and its ``value`` the same number of opaque ints (KV
    slots ``page * page_size + offset``, or negative placeholders when nothing is
    paged). Children are keyed by their first token, so no two siblings share one. Each
    namespace other than ``""`` starts at an anchor (an empty node whose parent is the
    root, kept in ``_tops`` and not among the root's children); ``""`` starts at the
    root. On
    hybrid models (``require_snapshots``) a node may carry a snapshot of the
    sliding-window / recurrent state after its last token; a match is cut back to the
    deepest node with one. Counters (hits, misses, cached and evicted tokens) and an LRU
    clock (ticks, not wall time) live beside the tree.

    Who owns what:

    - Threads: none of its own and no lock. The engine thread owns the tree (through
      :class:`kvcache.prefix_cache.PrefixCache`); every call comes from it.
    - Values: a value passed to :meth:`insert` beyond the returned length belongs to the
      tree until the tree hands it to ``on_free`` (eviction, :meth:`reset`, a disabled
      tree), exactly once; values for the part already cached stay the caller's to free.
      The tree never reads a value: the page allocator behind ``on_free`` owns the pages.
    - Nodes: a :class:`MatchResult`'s ``last_node`` is valid while locked. A split keeps
      the original node object as the lower part (it still ends at the same token), so
      locks, snapshots and results that name a node's end survive splits; nodes are
      never merged. An evicted or reset node gets ``parent = None``.

    Invariants (:meth:`check_invariants` recounts them all):

    - ``lock_ref(n) == locks taken on n + sum(lock_ref(c) for c in n.children)``: a
      locked node's ancestors are locked, an unlocked node's whole subtree is unlocked.
      Only unlocked leaves are evicted (least recently used first; on a hybrid tree
      leaves without a snapshot go first), and a parent left childless becomes a leaf.
    - ``evictable_size() == sum(len(n.value) for unlocked non-root n)`` and
      ``protected_size()`` the same over locked ones; lock walks and evictions move sizes
      between the two, so ``total_size()`` changes only by insert, eviction and reset.
    - ``len(n.key) == len(n.value)`` for every node, and no value appears twice in
      the tree.
    - A snapshot sits at a node's end, never mid-edge: on a hybrid tree a match never
      splits an edge to end where no snapshot can be.
    - Namespaces: every match, insert and lookup starts at the top of its namespace and
      lock walks stop at a top (a node with an empty key), so no call reaches a node or a
      value of another namespace. An anchor holds no value, is never locked, evicted or
      counted, and has at least one child (its last node's eviction drops it).
    """

    def __init__(
        self,
        on_free: OnFree | None = None,
        *,
        require_snapshots: bool = False,
        disable: bool = False,
    ):
        self.on_free = on_free
        # Called with each leaf just before eviction frees it (its slots still hold its
        # K/V): a lower tier writes back what it does not have yet.
        self.on_evict: Callable[[TreeNode], None] | None = None
        self.require_snapshots = require_snapshots
        self.disable = disable
        self.version = 0
        self._init_state()

    def _init_state(self) -> None:
        self._serials = itertools.count()
        self.root = TreeNode((), (), None, next(self._serials))
        self.root.lock_ref = 1  # the root is never evicted; lock walks stop below it
        self.root.namespace = ""
        self._anchors: dict[str, TreeNode] = {}  # the top of every namespace but "", by name
        self._clock = 0
        # Invariant: _evictable == sum(len(n.value) for non-root n with lock_ref == 0)
        #            _protected == sum(len(n.value) for non-root n with lock_ref > 0)
        self._evictable = 0
        self._protected = 0
        self._nodes = 0  # Invariant: number of non-root nodes
        # Bumped whenever an edge is added, split or dropped: what reads the tree's edges
        # (kvcache.continuations) knows when to read them again.
        self.version += 1
        self._hits = self._misses = self._cached_tokens = 0
        self._evicted_tokens = self._evicted_nodes = 0

    # ----------------------------------------------------------------- public API

    def match_prefix(self, tokens: Sequence[int], namespace: str = "") -> MatchResult:
        """The longest prefix of ``tokens`` cached in ``namespace`` (cut back to a snapshot
        when required). A miss ends at the namespace's top (the root if it has none yet)."""
        top = self._top(namespace)
        if self.disable or top is None:
            self._misses += 1
            return MatchResult((), 0, self.root, None)
        tokens = tuple(map(int, tokens))
        now = self._tick()
        # With require_snapshots a mid-edge end is never a resume point: don't split for it.
        path = self._walk(tokens, top, split=not self.require_snapshots)
        if self.require_snapshots:
            while path and path[-1].snapshot is None:
                path.pop()
        for node in path:
            node.last_access = now
        values = tuple(itertools.chain.from_iterable(node.value for node in path))
        last = path[-1] if path else top
        if values:
            self._hits += 1
            self._cached_tokens += len(values)
        else:
            self._misses += 1
        return MatchResult(values, len(values), last, last.snapshot)

    def insert(
        self,
        tokens: Sequence[int],
        values: Sequence[int],
        snapshot: object | None = None,
        namespace: str = "",
    ) -> int:
        """Cache ``tokens`` -> ``values`` in ``namespace``; returns how many leading tokens
        were already cached there.

        The tree takes ``values[returned:]``; ``values[:returned]`` stay the caller's
        (duplicates of the tree's own slots: free them). ``snapshot``, if given, is
        attached to the node ending exactly at ``len(tokens)``, replacing an older one.
        """
        tokens, values = tuple(map(int, tokens)), tuple(map(int, values))
        if len(tokens) != len(values):
            raise ValueError(f"insert: {len(tokens)} tokens but {len(values)} values")
        if snapshot is not None and not tokens:
            raise ValueError("insert: the root cannot hold a snapshot (no tokens given)")
        if self.disable:
            self._free(values)  # the tree takes everything and keeps nothing
            return 0
        if not tokens:
            return 0
        now = self._tick()
        top = self._top(namespace, create=True)
        path = self._walk(tokens, top, split=True)
        for node in path:
            node.last_access = now
        end = path[-1] if path else top
        already = sum(len(node.key) for node in path)
        if already < len(tokens):
            leaf = TreeNode(tokens[already:], values[already:], end, next(self._serials))
            leaf.last_access = now
            end.children[leaf.key[0]] = leaf
            self._evictable += len(leaf.value)  # new nodes start unlocked
            self._nodes += 1
            self.version += 1
            end = leaf
        if snapshot is not None:
            end.snapshot = snapshot
        return already

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Pin root..node against eviction.

        Invariant: lock_ref(n) == (locks taken on n itself) + sum(lock_ref(c) for c in
        n.children), so a locked node's ancestors are all locked, and an unlocked node's
        whole subtree is unlocked (hence evictable, leaf by leaf). Sizes move from
        evictable to protected when a node's count leaves 0.
        """
        if node.key and node.parent is None:
            raise ValueError(f"{node!r} is no longer in the tree (evicted or reset); match again")
        while node.key:  # up to the namespace's top (the root, or an anchor: never locked)
            if node.lock_ref == 0:
                self._evictable -= len(node.value)
                self._protected += len(node.value)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Release a lock taken by ``inc_lock_ref``. A lock on a node dropped by ``reset`` died
        with it."""
        if node.key and node.parent is None:
            return
        if node.key and node.lock_ref <= 0:
            raise ValueError(f"dec_lock_ref without a matching inc_lock_ref on {node!r}")
        # By the invariant every ancestor has lock_ref >= node's > 0: no count goes negative.
        while node.key:
            if node.lock_ref == 1:
                self._protected -= len(node.value)
                self._evictable += len(node.value)
            node.lock_ref -= 1
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free least-recently-used unlocked leaves until ``num_tokens`` slots are freed.

        A parent left childless becomes a candidate in turn. Stops early only when
        nothing evictable remains, so it frees >= min(num_tokens, evictable_size()).
        """
        heap = [
            self._evict_entry(n) for n in self._iter_nodes() if not n.children and n.lock_ref == 0
        ]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)[-1]
            parent = node.parent
            freed += len(node.value)
            if self.on_evict is not None:
                self.on_evict(node)
            self._delete_leaf(node)
            if parent.key and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, self._evict_entry(parent))
        return freed

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    def node_count(self) -> int:
        return self._nodes

    def stats(self) -> RadixStats:
        return RadixStats(
            hits=self._hits,
            misses=self._misses,
            cached_tokens=self._cached_tokens,
            evicted_tokens=self._evicted_tokens,
            evicted_nodes=self._evicted_nodes,
            nodes=self._nodes,
            evictable_tokens=self._evictable,
            protected_tokens=self._protected,
            namespaces=len(self._anchors) + bool(self.root.children),
        )

    def reset(self) -> None:
        """Drop every node (locked ones too) and free all values; counters start over."""
        old = list(self._iter_nodes())
        for node in [*old, *self._anchors.values()]:
            node.parent = None  # later dec_lock_ref on them is a no-op, inc_lock_ref an error
        self._init_state()
        for node in old:
            self._free(node.value)

    def node_at(self, tokens: Sequence[int], namespace: str = "") -> TreeNode | None:
        """The node of ``namespace`` ending exactly at ``len(tokens)`` (splitting an edge if
        needed), or None if ``tokens`` is not all cached there. Touches no counter and no
        LRU time."""
        tokens = tuple(map(int, tokens))
        top = self._top(namespace)
        if top is None:
            return self.root if not tokens else None
        if not tokens:
            return top
        path = self._walk(tokens, top, split=True)
        if sum(len(node.key) for node in path) != len(tokens):
            return None
        return path[-1]

    def peek_length(self, tokens: Sequence[int], namespace: str = "") -> int:
        """What ``match_prefix`` would return as length, without splitting, counting or
        touching LRU times."""
        return len(self.peek_values(tokens, namespace))

    def peek_values(self, tokens: Sequence[int], namespace: str = "") -> tuple[int, ...]:
        """What ``match_prefix`` would return as values (the cached prefix's slots),
        without splitting, counting or touching LRU times."""
        top = self._top(namespace)
        if self.disable or top is None:
            return ()
        tokens = tuple(map(int, tokens))
        path = self._walk(tokens, top, split=False)
        if self.require_snapshots:
            while path and path[-1].snapshot is None:
                path.pop()
        values = tuple(itertools.chain.from_iterable(node.value for node in path))
        matched = len(values)
        if self.require_snapshots or matched >= len(tokens):
            return values
        child = (path[-1] if path else top).children.get(tokens[matched])
        return values + (
            child.value[: _common_len(child.key, tokens, matched)] if child is not None else ()
        )

    def nodes(self) -> Iterator[TreeNode]:
        """Every node except the root and the anchors (any order), in every namespace."""
        return self._iter_nodes()

    def namespace_top(self, namespace: str = "") -> TreeNode | None:
        """The node ``namespace``'s paths start at (the root for ``""``), None while it
        holds nothing."""
        return self._top(namespace)

    def namespace_of(self, node: TreeNode) -> str:
        """The namespace ``node`` belongs to (its top's)."""
        while node.key:
            node = node.parent
        return node.namespace

    def all_values(self) -> set[int]:
        return {v for node in self._iter_nodes() for v in node.value}

    def check_invariants(self) -> None:
        """Recount everything; raise AssertionError naming the first violation."""
        root = self.root
        assert root.parent is None and root.key == () and root.value == (), (
            "root must be empty and parentless"
        )
        assert root.lock_ref == 1 and root.snapshot is None, (
            "root lock_ref must stay 1, with no snapshot"
        )
        evictable = protected = nodes = 0
        seen: set[int] = set()
        for name, anchor in self._anchors.items():
            assert name and anchor.namespace == name, (
                f"anchor of {name!r} names {anchor.namespace!r}"
            )
            assert anchor.parent is root and anchor.key == () and anchor.value == (), (
                f"anchor {name!r} not empty"
            )
            assert anchor.children and anchor.snapshot is None, (
                f"anchor {name!r}: childless or with a snapshot"
            )
        tops = [root, *self._anchors.values()]
        stack = list(tops)
        while stack:
            node = stack.pop()
            child_locks = 0
            for first, child in node.children.items():
                assert child.parent is node, f"{child!r}: parent link does not point back"
                assert child.key, f"{child!r}: empty key below the root"
                assert child.key[0] == first, (
                    f"{child!r}: keyed by {first}, starts with {child.key[0]}"
                )
                child_locks += child.lock_ref
                stack.append(child)
            if not node.key:  # a namespace's top
                continue
            nodes += 1
            assert len(node.key) == len(node.value), (
                f"{node!r}: {len(node.key)} tokens, {len(node.value)} values"
            )
            assert node.lock_ref >= child_locks >= 0, (
                f"{node!r}: lock_ref below its children's sum {child_locks}"
            )
            assert node.last_access <= self._clock, f"{node!r}: last_access ahead of the clock"
            if node.lock_ref == 0:
                evictable += len(node.value)
            else:
                protected += len(node.value)
            dup = seen.intersection(node.value)
            assert not dup and len(set(node.value)) == len(node.value), (
                f"{node!r}: duplicate value(s) {dup}"
            )
            seen.update(node.value)
        assert evictable == self._evictable, (
            f"evictable_size {self._evictable} != recount {evictable}"
        )
        assert protected == self._protected, (
            f"protected_size {self._protected} != recount {protected}"
        )
        assert nodes == self._nodes, f"node_count {self._nodes} != recount {nodes}"

    # ----------------------------------------------------------------- internals

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _top(self, namespace: str, create: bool = False) -> TreeNode | None:
        """The node a namespace's paths start at: the root for ``""``, else its anchor
        (made when ``create``; None when it has none)."""
        if not namespace:
            return self.root
        anchor = self._anchors.get(namespace)
        if anchor is None and create:
            anchor = TreeNode((), (), self.root, next(self._serials))
            anchor.namespace = namespace
            self._anchors[namespace] = anchor
        return anchor

    def _walk(self, tokens: tuple[int, ...], top: TreeNode, *, split: bool) -> list[TreeNode]:
        """Nodes fully matched by ``tokens`` below ``top`` (excluded). With ``split``, a
        match that ends mid-edge splits that edge so the last node ends exactly at the
        match; without, the partial edge is left out."""
        path: list[TreeNode] = []
        node, i = top, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            k = _common_len(child.key, tokens, i)
            if k < len(child.key):
                if not split:
                    break
                child = self._split_node(child, k)
            path.append(child)
            node, i = child, i + k
        return path

    def _split_node(self, child: TreeNode, k: int) -> TreeNode:
        """parent -> child  becomes  parent -> head (key[:k]) -> child (key[k:]).

        ``child`` stays the lower part, so locks, snapshots and MatchResults that refer
        to its end remain valid. The head copies child's lock_ref (the same locks pass
        through it), so sizes only move between nodes of equal lock state: unchanged.
        """
        assert 0 < k < len(child.key), f"split of {child!r} at {k}"
        head = TreeNode(child.key[:k], child.value[:k], child.parent, next(self._serials))
        head.lock_ref = child.lock_ref
        head.last_access = child.last_access
        head.children[child.key[k]] = child
        child.parent.children[child.key[0]] = head
        child.parent = head
        child.key, child.value = child.key[k:], child.value[k:]
        self._nodes += 1
        self.version += 1
        return head

    def _evict_entry(self, node: TreeNode) -> tuple[bool, int, int, TreeNode]:
        # In a hybrid tree a leaf without a snapshot is never a resume point: dead weight, evict
        # it first.
        useful = not (self.require_snapshots and node.snapshot is None)
        return (useful, node.last_access, node.serial, node)

    def _delete_leaf(self, node: TreeNode) -> None:
        assert not node.children and node.lock_ref == 0, f"evicting a non-leaf or locked {node!r}"
        parent = node.parent
        del parent.children[node.key[0]]
        if not parent.key and parent is not self.root and not parent.children:  # an emptied anchor
            del self._anchors[parent.namespace]
            parent.parent = None
        node.parent = None
        node.snapshot = None
        self._evictable -= len(node.value)
        self._nodes -= 1
        self.version += 1
        self._evicted_tokens += len(node.value)
        self._evicted_nodes += 1
        self._free(node.value)  # last, so the tree is consistent if on_free raises

    def _free(self, values: tuple[int, ...]) -> None:
        if values and self.on_free is not None:
            self.on_free(values)

    def _iter_nodes(self) -> Iterator[TreeNode]:
        """Every node except the root."""
        stack = [
            child for top in (self.root, *self._anchors.values()) for child in top.children.values()
        ]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node
