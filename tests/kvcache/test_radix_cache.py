"""The token-keyed radix tree: unit tests, then a property test against a model."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvcache.radix_cache import MatchResult, RadixCache, RadixStats, TreeNode


class FreeLog:
    """A pool stand-in: records every on_free call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, values: tuple[int, ...]) -> None:
        self.calls.append(values)

    @property
    def values(self) -> list[int]:
        return [v for call in self.calls for v in call]


def path_of(cache: RadixCache, node: TreeNode) -> tuple[int, ...]:
    """The tokens from the top of ``node``'s namespace to its end."""
    parts = []
    while node.key:
        assert node.parent is not None, "node is detached"
        parts.append(node.key)
        node = node.parent
    return tuple(t for key in reversed(parts) for t in key)


def slots(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


# ------------------------------------------------------------------ match / insert / split


def test_empty_tree_matches_nothing():
    cache = RadixCache()
    m = cache.match_prefix([1, 2, 3])
    assert m == MatchResult((), 0, cache.root, None)
    assert cache.node_count() == 0 and cache.total_size() == 0
    cache.check_invariants()


def test_insert_then_match_exact_and_longer():
    cache = RadixCache()
    assert cache.insert([1, 2, 3], [10, 11, 12]) == 0
    assert cache.match_prefix([1, 2, 3]).values == (10, 11, 12)
    m = cache.match_prefix([1, 2, 3, 4, 5])
    assert (m.values, m.length) == ((10, 11, 12), 3)
    assert path_of(cache, m.last_node) == (1, 2, 3)
    assert cache.match_prefix([2, 3]).length == 0
    cache.check_invariants()


def test_insert_returns_cached_prefix_and_keeps_the_trees_values():
    log = FreeLog()
    cache = RadixCache(log)
    cache.insert([1, 2, 3], [10, 11, 12])
    # The first three tokens were cached: the tree keeps 10..12, the caller frees 20..22.
    assert cache.insert([1, 2, 3, 4, 5], [20, 21, 22, 23, 24]) == 3
    assert cache.match_prefix([1, 2, 3, 4, 5]).values == (10, 11, 12, 23, 24)
    assert cache.all_values() == {10, 11, 12, 23, 24}
    assert cache.insert([1, 2], [30, 31]) == 2  # a prefix of what is there: nothing taken
    assert cache.all_values() == {10, 11, 12, 23, 24}
    assert log.calls == []
    cache.check_invariants()


def test_match_mid_edge_splits_so_the_match_ends_at_a_node():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    assert cache.node_count() == 1
    m = cache.match_prefix([1, 2, 9])
    assert m.values == (10, 11)
    assert m.last_node.key == (1, 2) and path_of(cache, m.last_node) == (1, 2)
    assert cache.node_count() == 2
    (tail,) = m.last_node.children.values()
    assert tail.key == (3, 4) and tail.value == (12, 13)
    cache.check_invariants()


def test_insert_diverging_mid_edge_branches():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], slots(10, 4))
    assert cache.insert([1, 2, 7, 8], slots(20, 4)) == 2
    assert cache.node_count() == 3
    assert cache.match_prefix([1, 2, 3, 4]).values == (10, 11, 12, 13)
    assert cache.match_prefix([1, 2, 7, 8]).values == (10, 11, 22, 23)
    cache.check_invariants()


def test_split_keeps_the_original_node_as_the_lower_part():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], slots(10, 4))
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.match_prefix([1, 2])  # splits node's edge
    assert node.key == (3, 4) and path_of(cache, node) == (1, 2, 3, 4)


def test_insert_rejects_bad_arguments():
    cache = RadixCache()
    with pytest.raises(ValueError, match="tokens but"):
        cache.insert([1, 2], [10])
    with pytest.raises(ValueError, match="root"):
        cache.insert([], [], snapshot="s")
    assert cache.insert([], []) == 0


def test_accepts_any_int_sequence():
    cache = RadixCache()
    cache.insert(range(5), range(100, 105))
    assert cache.match_prefix((0, 1, 2)).values == (100, 101, 102)


# ------------------------------------------------------------------ locks


def test_lock_moves_sizes_along_the_path_to_the_root():
    cache = RadixCache()
    cache.insert([1, 2, 3], slots(10, 3))
    cache.insert([1, 2, 3, 4, 5], slots(20, 5))
    cache.insert([1, 9], slots(30, 2))  # splits [1, 2, 3] into [1] -> [2, 3]
    assert (cache.evictable_size(), cache.protected_size()) == (6, 0)
    leaf = cache.match_prefix([1, 2, 3, 4, 5]).last_node
    cache.inc_lock_ref(leaf)
    assert (cache.evictable_size(), cache.protected_size()) == (1, 5)
    cache.inc_lock_ref(leaf)
    assert (cache.evictable_size(), cache.protected_size()) == (1, 5)
    cache.check_invariants()
    cache.dec_lock_ref(leaf)
    assert (cache.evictable_size(), cache.protected_size()) == (1, 5)
    cache.dec_lock_ref(leaf)
    assert (cache.evictable_size(), cache.protected_size()) == (6, 0)
    assert cache.total_size() == 6
    cache.check_invariants()


def test_split_of_a_locked_edge_gives_the_head_the_same_lock_ref():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], slots(10, 4))
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)
    head = cache.match_prefix([1, 2]).last_node
    assert head.lock_ref == node.lock_ref == 1
    assert cache.protected_size() == 4
    cache.check_invariants()
    cache.dec_lock_ref(node)
    assert head.lock_ref == 0 and cache.evictable_size() == 4
    cache.check_invariants()


def test_unbalanced_dec_lock_ref_raises():
    cache = RadixCache()
    cache.insert([1, 2], [10, 11])
    node = cache.match_prefix([1, 2]).last_node
    with pytest.raises(ValueError, match="without a matching"):
        cache.dec_lock_ref(node)
    cache.inc_lock_ref(cache.root)  # the root is always pinned: no-ops
    cache.dec_lock_ref(cache.root)
    cache.check_invariants()


def test_locking_an_evicted_node_raises():
    cache = RadixCache()
    cache.insert([1, 2], [10, 11])
    node = cache.match_prefix([1, 2]).last_node
    cache.evict(2)
    with pytest.raises(ValueError, match="no longer in the tree"):
        cache.inc_lock_ref(node)


# ------------------------------------------------------------------ eviction


def test_evict_least_recently_used_leaf_first():
    log = FreeLog()
    cache = RadixCache(log)
    cache.insert([1, 1], [10, 11])
    cache.insert([2, 2], [20, 21])
    cache.insert([3, 3], [30, 31])
    cache.match_prefix([1, 1])  # [2, 2] is now the oldest
    assert cache.evict(1) == 2
    assert log.calls == [(20, 21)]
    assert cache.match_prefix([2, 2]).length == 0
    assert cache.evict(2) == 2
    assert log.calls[-1] == (30, 31)
    cache.check_invariants()


def test_evict_cascades_to_parents_that_become_leaves():
    log = FreeLog()
    cache = RadixCache(log)
    cache.insert([1, 2, 3], slots(10, 3))
    cache.insert([1, 2, 4], slots(20, 3))  # [1, 2] -> {[3], [4]}
    assert cache.evict(100) == 4
    assert sorted(log.values) == [10, 11, 12, 22]
    assert cache.node_count() == 0 and cache.total_size() == 0
    stats = cache.stats()
    assert (stats.evicted_tokens, stats.evicted_nodes) == (4, 3)
    cache.check_invariants()


def test_evict_skips_locked_paths():
    log = FreeLog()
    cache = RadixCache(log)
    cache.insert([1, 2, 3], slots(10, 3))
    cache.insert([1, 2, 4, 5], slots(20, 4))
    locked = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(locked)
    assert cache.evictable_size() == 2
    assert cache.evict(10) == 2  # only [4, 5]
    assert sorted(log.values) == [22, 23]
    assert cache.match_prefix([1, 2, 3]).values == (10, 11, 12)
    assert cache.evict(10) == 0
    cache.dec_lock_ref(locked)
    assert cache.evict(10) == 3
    cache.check_invariants()


def test_evict_nothing_requested_frees_nothing():
    cache = RadixCache()
    cache.insert([1], [10])
    assert cache.evict(0) == 0 and cache.total_size() == 1


# ------------------------------------------------------------------ snapshots


def test_snapshot_stored_at_the_exact_end_and_returned():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], slots(10, 4), snapshot="s4")
    cache.insert([1, 2], [20, 21], snapshot="s2")  # splits to put s2 at token 2
    assert cache.match_prefix([1, 2]).snapshot == "s2"
    assert cache.match_prefix([1, 2, 3, 4, 5]).snapshot == "s4"
    cache.insert([1, 2, 3, 4], slots(30, 4), snapshot="s4b")  # replaces
    assert cache.match_prefix([1, 2, 3, 4]).snapshot == "s4b"
    cache.check_invariants()


def test_without_require_snapshots_the_match_is_not_cut():
    cache = RadixCache()
    cache.insert([1, 2], [10, 11], snapshot="s2")
    cache.insert([1, 2, 3, 4], slots(12, 4))
    m = cache.match_prefix([1, 2, 3, 4])
    assert m.length == 4 and m.snapshot is None


def test_require_snapshots_cuts_back_to_the_deepest_snapshot():
    cache = RadixCache(require_snapshots=True)
    cache.insert([1, 2, 3, 4, 5, 6], slots(10, 6))
    # root counts
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]) == MatchResult((), 0, cache.root, None)
    cache.insert([1, 2, 3], [20, 21, 22], snapshot="s3")
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert (m.values, m.snapshot) == ((10, 11, 12), "s3")
    assert path_of(cache, m.last_node) == (1, 2, 3)
    nodes = cache.node_count()
    assert cache.match_prefix([1, 2, 3, 4, 9]).length == 3
    assert cache.node_count() == nodes  # a mid-edge end is no resume point: no split
    cache.insert([1, 2, 3, 4, 5, 6], slots(30, 6), snapshot="s6")
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).snapshot == "s6"
    cache.check_invariants()


def test_eviction_drops_the_snapshot_and_the_match_cuts_further():
    cache = RadixCache(require_snapshots=True)
    cache.insert([1, 2], [10, 11], snapshot="s2")
    cache.insert([1, 2, 3], [10, 11, 12], snapshot="s3")
    leaf = cache.match_prefix([1, 2, 3]).last_node
    assert cache.evict(1) == 1
    assert leaf.snapshot is None
    assert cache.match_prefix([1, 2, 3]).snapshot == "s2"


def test_hybrid_eviction_prefers_leaves_without_a_snapshot():
    log = FreeLog()
    cache = RadixCache(log, require_snapshots=True)
    cache.insert([1], [10], snapshot="s")
    cache.insert([2], [20])  # newer, but never a resume point
    assert cache.evict(1) == 1
    assert log.calls == [(20,)]


# ------------------------------------------------------------------ disable, counters, reset


def test_disabled_cache_stores_nothing_and_frees_what_it_is_given():
    log = FreeLog()
    cache = RadixCache(log, disable=True)
    assert cache.insert([1, 2, 3], [10, 11, 12], snapshot="s") == 0
    assert log.calls == [(10, 11, 12)]
    m = cache.match_prefix([1, 2, 3])
    assert m.length == 0 and m.last_node is cache.root
    cache.inc_lock_ref(m.last_node)
    cache.dec_lock_ref(m.last_node)
    assert cache.node_count() == 0 and cache.evict(10) == 0
    assert cache.stats().misses == 1
    cache.check_invariants()


def test_counters():
    cache = RadixCache()
    cache.insert([1, 2, 3], slots(10, 3))
    cache.match_prefix([1, 2, 3, 4])
    cache.match_prefix([1, 2])
    cache.match_prefix([5])
    cache.evict(1)  # the split left [1, 2] -> [3]: the leaf [3] goes
    assert cache.stats() == RadixStats(
        hits=2,
        misses=1,
        cached_tokens=5,
        evicted_tokens=1,
        evicted_nodes=1,
        nodes=1,
        evictable_tokens=2,
        protected_tokens=0,
        namespaces=1,
    )


def test_reset_frees_everything_even_locked_and_old_locks_die():
    log = FreeLog()
    cache = RadixCache(log)
    cache.insert([1, 2, 3], slots(10, 3))
    cache.insert([1, 5], [20, 21])
    node = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(node)
    cache.match_prefix([7])
    cache.reset()
    assert sorted(log.values) == [10, 11, 12, 21]
    assert cache.node_count() == cache.total_size() == 0
    assert cache.stats() == RadixStats(0, 0, 0, 0, 0, 0, 0, 0)
    cache.dec_lock_ref(node)  # the lock died with the reset: a no-op
    with pytest.raises(ValueError):
        cache.inc_lock_ref(node)
    cache.check_invariants()


def test_check_invariants_catches_corruption():
    cache = RadixCache()
    cache.insert([1, 2], [10, 11])
    cache.insert([3, 4], [12, 13])
    cache.check_invariants()
    cache._evictable += 1
    with pytest.raises(AssertionError, match="evictable_size"):
        cache.check_invariants()
    cache._evictable -= 1
    cache.root.children[3].value = (10, 13)
    with pytest.raises(AssertionError, match="duplicate"):
        cache.check_invariants()
    cache.root.children[3].value = (12, 13)
    cache.root.children[1].lock_ref = -1
    with pytest.raises(AssertionError, match="lock_ref"):
        cache.check_invariants()


def test_module_is_pure_python():
    code = (
        "import sys, kvcache.radix_cache; bad = {'mlx', 'core', 'app', 'PySide6'} & "
        "set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ property test

TOKENS = st.lists(st.integers(0, 2), max_size=7).map(tuple)
NAMESPACES = st.sampled_from(["", "", "a", "b"])  # mostly the default one: deep trees too


class RadixMachine(RuleBasedStateMachine):
    """Random insert / match / lock / unlock / evict / reset against a model.

    The model maps every cached prefix to the slot of its last token (a radix tree is
    a prefix-closed set of such prefixes), plus the snapshot stored at each prefix. Its
    keys are ``(namespace, *tokens)``: a prefix inserted in one namespace is cached in
    that one only, so every match checked against the model is also an isolation check.
    """

    require_snapshots = False

    def __init__(self) -> None:
        super().__init__()
        self.cache = RadixCache(self._on_free, require_snapshots=self.require_snapshots)
        self.freed: set[int] = set()
        self.double_frees: list[int] = []
        self.taken: set[int] = set()  # every value the tree took ownership of
        self.next_value = 0
        self.model: dict[tuple[int, ...], int] = {}
        self.snaps: dict[tuple[int, ...], object] = {}
        self.locks: list[tuple[TreeNode, tuple[int, ...]]] = []
        self.matches = self.matched_tokens = self.hits = self.evicted_tokens = 0

    def _on_free(self, values: tuple[int, ...]) -> None:
        for v in values:
            if v in self.freed:
                self.double_frees.append(v)
            self.freed.add(v)

    def _sync_model(self) -> None:
        self.model = {k: v for k, v in self.model.items() if v not in self.freed}
        self.snaps = {k: s for k, s in self.snaps.items() if k in self.model}

    def _cached_len(self, key: tuple) -> int:
        """Tokens of ``key`` (namespace, *tokens) cached in its namespace."""
        j = 0
        while j < len(key) - 1 and key[: j + 2] in self.model:
            j += 1
        return j

    def _resume_len(self, key: tuple) -> int:
        j = self._cached_len(key)
        if self.require_snapshots:
            while j > 0 and key[: j + 1] not in self.snaps:
                j -= 1
        return j

    @rule(tokens=TOKENS, with_snapshot=st.booleans(), ns=NAMESPACES)
    def insert(self, tokens, with_snapshot, ns):
        values = slots(self.next_value, len(tokens))
        self.next_value += len(tokens)
        snapshot = object() if with_snapshot and tokens else None
        already = self.cache.insert(tokens, values, snapshot, namespace=ns)
        key = (ns, *tokens)
        assert already == self._cached_len(key)
        self.taken.update(values[already:])
        for j in range(already, len(tokens)):
            self.model[key[: j + 2]] = values[j]
        if snapshot is not None:
            self.snaps[key] = snapshot

    def _match(self, tokens, ns) -> MatchResult:
        m = self.cache.match_prefix(tokens, namespace=ns)
        key = (ns, *tokens)
        n = self._resume_len(key)
        assert m.length == len(m.values) == n
        assert m.values == tuple(self.model[key[: j + 2]] for j in range(n))  # property 1
        assert path_of(self.cache, m.last_node) == tokens[:n]
        assert n == 0 or self.cache.namespace_of(m.last_node) == ns
        assert m.snapshot is self.snaps.get(key[: n + 1])
        self.matches += 1
        self.hits += n > 0
        self.matched_tokens += n
        return m

    @rule(tokens=TOKENS, ns=NAMESPACES)
    def match(self, tokens, ns):
        self._match(tokens, ns)

    @rule(tokens=TOKENS, ns=NAMESPACES)
    def lock(self, tokens, ns):
        m = self._match(tokens, ns)
        self.cache.inc_lock_ref(m.last_node)
        self.locks.append((m.last_node, (ns, *tokens[: m.length])))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        node, _ = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.cache.dec_lock_ref(node)

    @rule(num_tokens=st.integers(1, 12))
    def evict(self, num_tokens):
        evictable, freed_before = self.cache.evictable_size(), len(self.freed)
        got = self.cache.evict(num_tokens)
        assert got == len(self.freed) - freed_before
        assert got >= num_tokens if evictable >= num_tokens else got == evictable  # property 4
        assert self.cache.evictable_size() == evictable - got
        self.evicted_tokens += got
        self._sync_model()
        assert all(k[:-1] in self.model for k in self.model if len(k) > 2), "eviction left a hole"

    @rule(roll=st.integers(0, 7))
    def reset(self, roll):
        if roll != 7:  # rarely: a reset wipes the state the other rules build up
            return
        self.cache.reset()
        self._sync_model()
        assert not self.model
        for node, _ in self.locks:
            self.cache.dec_lock_ref(node)  # dead locks: no-ops
        self.locks = []
        self.matches = self.matched_tokens = self.hits = self.evicted_tokens = 0

    @invariant()
    def consistent(self):
        self.cache.check_invariants()
        # Property 3: each value the tree took is either in it or freed once, never both.
        assert not self.double_frees, f"double free of {self.double_frees}"
        in_tree = self.cache.all_values()
        assert in_tree.isdisjoint(self.freed)
        assert in_tree | self.freed == self.taken
        assert in_tree == set(self.model.values())
        assert self.cache.total_size() == len(self.model)
        # Property 2: a locked prefix stays cached, and exactly the locked paths are protected.
        protected: set[tuple] = set()
        for node, prefix in self.locks:
            assert path_of(self.cache, node) == prefix[1:]
            protected.update(prefix[:j] for j in range(2, len(prefix) + 1))
        assert protected <= self.model.keys()
        assert self.cache.protected_size() == len(protected)
        stats = self.cache.stats()
        assert (stats.hits, stats.misses) == (self.hits, self.matches - self.hits)
        assert (stats.cached_tokens, stats.evicted_tokens) == (
            self.matched_tokens,
            self.evicted_tokens,
        )
        assert stats.nodes == self.cache.node_count()
        assert stats.namespaces == len({key[0] for key in self.model})


class HybridRadixMachine(RadixMachine):
    require_snapshots = True


_PROPERTY_SETTINGS = settings(
    max_examples=150, stateful_step_count=40, deadline=None, database=None
)
TestRadixProperties = RadixMachine.TestCase
TestRadixProperties.settings = _PROPERTY_SETTINGS
TestHybridRadixProperties = HybridRadixMachine.TestCase
TestHybridRadixProperties.settings = _PROPERTY_SETTINGS


def test_node_at_finds_exact_ends_and_splits():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    before = cache.stats()
    node = cache.node_at([1, 2])
    assert node is not None and node.key == (1, 2) and node.value == (10, 11)
    assert cache.node_at([1, 2, 3, 4]).key == (3, 4)
    assert cache.node_at([1, 2, 9]) is None and cache.node_at([]) is cache.root
    assert cache.stats().hits == before.hits and cache.stats().misses == before.misses
    assert len(list(cache.nodes())) == cache.node_count() == 2
    cache.check_invariants()


def test_peek_length_and_values_agree_with_match_and_change_nothing():
    for hybrid in (False, True):
        cache = RadixCache(require_snapshots=hybrid)
        cache.insert([1, 2, 3, 4, 5], [10, 11, 12, 13, 14], snapshot="end" if hybrid else None)
        cache.insert([1, 2, 3], [10, 11, 12], snapshot="mid" if hybrid else None)
        before = (cache.stats(), cache.node_count())
        for probe in ([1, 2, 3, 4, 9], [1, 2], [1, 2, 3, 4, 5, 6], [7]):
            length, values = cache.peek_length(probe), cache.peek_values(probe)
            assert (cache.stats(), cache.node_count()) == before
            match = cache.match_prefix(probe)
            assert (length, values) == (match.length, match.values)
            before = (cache.stats(), cache.node_count())
        assert cache.peek_values([1, 2, 3], "another namespace") == ()
        cache.check_invariants()


def test_namespaces_never_match_each_other():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], slots(10, 4), namespace="alice")
    assert cache.match_prefix([1, 2, 3, 4, 5], namespace="bob").length == 0
    assert cache.match_prefix([1, 2, 3, 4, 5]).length == 0  # "" is a namespace of its own
    assert cache.peek_length([1, 2, 3], namespace="bob") == 0
    assert cache.node_at([1, 2], namespace="bob") is None
    m = cache.match_prefix([1, 2, 9], namespace="alice")
    assert (m.length, m.values) == (2, (10, 11))
    assert cache.namespace_of(m.last_node) == "alice"
    # The same tokens in another namespace are a path of their own, with their own slots.
    assert cache.insert([1, 2, 3], slots(20, 3), namespace="bob") == 0
    assert cache.match_prefix([1, 2, 3, 4], namespace="bob").values == (20, 21, 22)
    assert cache.match_prefix([1, 2, 3, 9], namespace="alice").values == (10, 11, 12)
    assert cache.stats().namespaces == 2
    cache.check_invariants()


def test_eviction_is_one_lru_over_every_namespace_and_drops_empty_anchors():
    log = FreeLog()
    cache = RadixCache(log)
    cache.insert([1, 2], [10, 11], namespace="a")
    cache.insert([1, 2], [20, 21], namespace="b")
    cache.insert([1, 2], [30, 31])
    cache.match_prefix([1, 2, 0], namespace="a")  # "a" is now the most recently used
    locked = cache.match_prefix([1, 2, 0], namespace="b").last_node
    cache.inc_lock_ref(locked)
    assert cache.evict(2) == 2 and log.values == [30, 31]  # "": the oldest unlocked
    assert cache.evict(2) == 2 and log.values[2:] == [10, 11]  # then "a"; "b" is locked
    assert cache.stats().namespaces == 1 and cache.match_prefix([1, 2], namespace="a").length == 0
    cache.check_invariants()
    cache.dec_lock_ref(locked)
    assert cache.evict(5) == 2 and cache.stats().namespaces == 0
    # a miss's node: no lock to give
    cache.dec_lock_ref(cache.match_prefix([1], namespace="b").last_node)
    cache.check_invariants()
