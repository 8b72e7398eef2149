"""Continuations read from a radix tree (kvcache/continuations.py): what followed a run of
tokens, along edges and down the most recent branch, in one namespace only."""

from __future__ import annotations

import pytest

from kvcache.continuations import Continuations
from kvcache.radix_cache import RadixCache


def tree_with(*texts: list[int], namespace: str = "") -> RadixCache:
    tree = RadixCache()
    for tokens in texts:
        tree.insert(tokens, range(len(tokens)), namespace=namespace)
    return tree


def test_follows_a_run_along_its_edge():
    tree = tree_with([1, 2, 3, 4, 5, 6, 7])
    follow = Continuations(tree, ngram=3).follow
    assert follow([9, 2, 3, 4], 2) == [5, 6]
    assert follow([2, 3, 4], 10) == [5, 6, 7]  # as much as there is
    assert follow([5, 6, 7], 4) == []  # nothing followed the end
    assert follow([7, 7, 7], 4) == []


def test_crosses_edges_taking_the_most_recently_used_branch():
    tree = tree_with([1, 2, 3, 4, 10, 11], [1, 2, 3, 4, 20, 21])  # split after 4
    follow = Continuations(tree, ngram=2).follow
    assert follow([3, 4], 2) == [20, 21]  # the branch inserted (used) last
    tree.match_prefix([1, 2, 3, 4, 10, 11])  # now the other one is the most recent
    assert follow([3, 4], 2) == [10, 11]
    assert follow([2, 3], 3) == [4, 10, 11]  # a run that ends an edge: its child follows


def test_a_run_spanning_two_edges_is_found():
    tree = tree_with([1, 2, 3, 4, 10, 11], [1, 2, 3, 4, 20, 21])
    follow = Continuations(tree, ngram=3).follow
    assert follow([3, 4, 20], 1) == [21]  # 3, 4 end one edge, 20 starts the next
    assert follow([2, 3, 4], 2) == [20, 21]


def test_reads_again_after_the_tree_changed():
    tree = tree_with([1, 2, 3, 4])
    follow = Continuations(tree, ngram=2).follow
    assert follow([5, 6], 2) == []
    tree.insert([5, 6, 7, 8], range(4))
    assert follow([5, 6], 2) == [7, 8]
    tree.evict(100)
    assert follow([5, 6], 2) == []


def test_never_reads_another_namespace():
    tree = RadixCache()
    tree.insert([1, 2, 3, 4, 5], range(5), namespace="key:alice")
    follow = Continuations(tree, ngram=2).follow
    assert follow([2, 3], 2, "key:alice") == [4, 5]
    assert follow([2, 3], 2, "key:bob") == []
    assert follow([2, 3], 2) == []  # nor does the default namespace read others'
    tree.insert([7, 2, 3, 9], range(4))
    assert follow([2, 3], 2) == [9]
    assert follow([2, 3], 2, "key:alice") == [4, 5]


def test_a_disabled_tree_offers_nothing():
    tree = RadixCache(disable=True)
    tree.insert([1, 2, 3], range(3))
    assert Continuations(tree, ngram=1).follow([1], 2) == []


def test_an_ngram_has_tokens():
    with pytest.raises(ValueError, match="at least one token"):
        Continuations(RadixCache(), ngram=0)
