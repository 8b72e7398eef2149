"""kvcache.disk_index: a prompt's stored pages found by its tokens, in memory."""

from __future__ import annotations

from kvcache.disk_index import DiskIndex
from kvcache.store import IndexedPage
from kvcache.store_format import chain_keys, pack_tokens, page_key

FP = "model-a"


def chain_pages(chain: list[tuple[int, ...]], snapshots: tuple[int, ...] = ()) -> list[IndexedPage]:
    keys = chain_keys(FP, chain)
    return [
        IndexedPage(key, parent, pack_tokens(tokens), i in snapshots)
        for i, (key, parent, tokens) in enumerate(zip(keys, [None, *keys[:-1]], chain))
    ]


def test_a_prompt_finds_its_chain_and_a_partial_tail():
    chain = [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11)]
    index = DiskIndex(FP, chain_pages(chain, snapshots=(1,)))
    found = index.match([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    assert [p.tokens for p in found] == chain and [p.has_snapshot for p in found] == [
        False,
        True,
        False,
    ]
    partial = index.match([1, 2, 3, 4, 5, 6, 99, 100])  # the second page shares two tokens
    assert [p.tokens for p in partial] == chain[:2]
    assert index.match([7, 7, 7]) == [] and index.match([1, 2, 3]) != []


def test_the_longer_of_two_matching_pages_is_followed():
    short = chain_pages([(1, 2)])
    long = chain_pages([(1, 2, 3, 4), (5, 6)])
    index = DiskIndex(FP, short + long)
    assert [p.tokens for p in index.match([1, 2, 3, 4, 5, 6, 0])] == [(1, 2, 3, 4), (5, 6)]


def test_discarded_and_forged_pages_are_never_followed():
    chain = [(1, 2), (3, 4), (5, 6)]
    pages = chain_pages(chain)
    index = DiskIndex(FP, pages)
    index.discard([pages[1].key])
    assert [p.tokens for p in index.match([1, 2, 3, 4, 5, 6])] == [(1, 2)]
    assert len(index) == 2 and pages[1].key not in index
    forged = IndexedPage(
        page_key(FP, pages[0].key, (9, 9)), pages[0].key, pack_tokens((3, 4)), False
    )
    index.add([forged])  # its key is not the hash of its tokens
    assert [p.tokens for p in index.match([1, 2, 3, 4])] == [(1, 2)]
    other = DiskIndex("model-b", pages)  # another model's fingerprint: keys never match
    assert other.match([1, 2, 3, 4]) == []
