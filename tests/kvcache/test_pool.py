"""kvcache.pool: page writes and gathers, in-place memory use, allocator, budget."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import KVCache
from mlx_lm.utils import load

from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache import pool as pool_module
from kvcache.layout import AUXILIARY, FULL, CacheLayout, CacheSpec, cache_at, cache_layout
from kvcache.pool import (
    MIN_POOL_PAGES,
    KVPagePool,
    PageAllocator,
    page_runs,
    pool_pages_for_budget,
)

HEADS, HEAD_DIM, PAGE = 2, 8, 4


def page_slots(page_ids: list[int], page_size: int, stop: int, start: int = 0) -> mx.array:
    """The pool slots of tokens ``start..stop-1`` of a sequence stored in ``page_ids``."""
    first, last = start // page_size, math.ceil(stop / page_size)
    pages = mx.array(page_ids[first:last], dtype=mx.int32)[:, None]
    slots = (pages * page_size + mx.arange(page_size, dtype=mx.int32)).reshape(-1)
    return slots[start - first * page_size : stop - first * page_size]


def full_layout(
    num_layers: int = 2,
    heads: int = HEADS,
    head_dim: int = HEAD_DIM,
    dtype: str = "float32",
    value_dim: int | None = None,
) -> CacheLayout:
    return CacheLayout(
        tuple(
            CacheSpec(
                i,
                FULL,
                slot=i,
                key_heads=heads,
                key_dim=head_dim,
                value_heads=heads,
                value_dim=value_dim or head_dim,
                dtype=dtype,
            )
            for i in range(num_layers)
        )
    )


def random_kv(n: int, heads: int = HEADS, head_dim: int = HEAD_DIM, seed: int = 0):
    keys, values = mx.random.normal((2, heads, n, head_dim), key=mx.random.key(seed))
    return keys, values


def assert_bitwise_equal(a: mx.array, b: mx.array) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    assert mx.array_equal(a, b).item()


# --- KVPagePool --------------------------------------------------------------------


def test_pool_shapes_and_null_page():
    pool = KVPagePool(full_layout(3, dtype="float16"), num_pages=5, page_size=PAGE)
    assert pool.num_layers == 3 and pool.num_pages == 5 and pool.page_size == PAGE
    assert pool.keys[0].shape == (6, HEADS, PAGE, HEAD_DIM)
    assert pool.keys[0].dtype == mx.float16
    assert pool.nbytes == 2 * 3 * 6 * HEADS * PAGE * HEAD_DIM * 2


def test_write_then_gather_returns_the_written_bytes():
    pool = KVPagePool(full_layout(), num_pages=8, page_size=PAGE)
    pages, n = [5, 2, 7], 10  # the last page is half full
    keys, values = random_kv(n)
    pool.write(1, pages, keys, values)
    got_k, got_v = pool.gather(1, page_slots(pages, PAGE, n))
    assert_bitwise_equal(got_k, keys[None])
    assert_bitwise_equal(got_v, values[None])
    # a middle stretch, from a plain list of slots
    k_mid, _ = pool.gather(1, [5 * PAGE + 3, 2 * PAGE, 2 * PAGE + 1])
    assert_bitwise_equal(k_mid, keys[None, :, 3:6])
    # the pad and the other layer stay zero; so does the null page
    assert not mx.any(pool.keys[1][7, :, 2:]).item()
    assert not mx.any(pool.keys[0]).item()
    assert not mx.any(pool.keys[1][0]).item() and not mx.any(pool.values[1][0]).item()


def test_token_writes_starting_mid_page():
    pool = KVPagePool(full_layout(), num_pages=8, page_size=PAGE)
    pages = [3, 6, 1, 8]
    keys, values = random_kv(15, seed=1)
    pool.write(0, pages[:2], keys[:, :6], values[:, :6])  # tokens 0..5: page 6 half full
    pool.write_slots(0, page_slots(pages, PAGE, 15, start=6), keys[:, 6:], values[:, 6:])
    got_k, got_v = pool.gather(0, page_slots(pages, PAGE, 15))
    assert_bitwise_equal(got_k, keys[None])
    assert_bitwise_equal(got_v, values[None])


@pytest.mark.parametrize("start, n", [(6, 9), (8, 7), (5, 2), (0, 15), (3, 13)])
def test_write_tokens_finishes_the_partial_page_then_writes_pages(start, n):
    pool = KVPagePool(full_layout(), num_pages=8, page_size=PAGE)
    pages = [3, 6, 1, 8]
    keys, values = random_kv(start + n, seed=2)
    if start:
        pool.write_tokens(1, pages, 0, keys[:, :start], values[:, :start])
    pool.write_tokens(1, pages, start, keys[:, start:], values[:, start:])
    got_k, got_v = pool.gather(1, page_slots(pages, PAGE, start + n))
    assert_bitwise_equal(got_k, keys[None])
    assert_bitwise_equal(got_v, values[None])


def test_page_runs():
    assert page_runs([4, 5, 6, 2, 9, 10]) == [(0, 4, 3), (3, 2, 1), (4, 9, 2)]
    assert page_runs([]) == []


def test_bad_writes_are_refused():
    pool = KVPagePool(full_layout(), num_pages=4, page_size=PAGE)
    keys, values = random_kv(5)
    with pytest.raises(ValueError, match="fill 2 pages, not 3"):
        pool.write(0, [1, 2, 3], keys, values)
    with pytest.raises(ValueError, match="outside"):
        pool.write(0, [0, 1], keys, values)  # the null page
    with pytest.raises(ValueError, match="distinct"):
        pool.write(0, [2, 2], keys, values)
    with pytest.raises(ValueError, match="outside"):
        pool.write_slots(0, list(range(2, 7)), keys, values)
    with pytest.raises(ValueError, match="expected"):
        pool.write_slots(0, list(range(4, 8)), keys, values)


def test_writes_reuse_the_pool_buffer():
    """A 64 MB pool: neither write kind may allocate anything near a pool's copy."""
    heads, head_dim, page = 4, 64, 64
    pool = KVPagePool(full_layout(1, heads, head_dim), num_pages=511, page_size=page)
    assert pool.nbytes == 64 * 2**20
    keys, values = random_kv(100, heads, head_dim)
    slots = page_slots([9, 10, 11], page, 150, start=50)
    gathered = pool.gather(0, slots)  # an evaluated read left alive must not force a copy
    mx.eval(keys, values, slots)
    buffers = (pool.keys[0], pool.values[0])
    for write in (
        lambda: pool.write(0, [3, 4], keys, values),
        lambda: pool.write(0, [12, 5], keys, values),
        lambda: pool.write_slots(0, slots, keys, values),
        lambda: pool.write_tokens(0, [9, 10, 11], 50, keys, values),
    ):
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        write()
        growth = max(0, mx.get_peak_memory() - before)
        assert growth < 0.1 * pool.nbytes, f"a write allocated {growth} bytes"
    assert (pool.keys[0], pool.values[0]) == buffers  # the same array objects, mutated
    assert_bitwise_equal(pool.gather(0, slots)[0], keys[None])
    del gathered


def test_gathered_kv_continues_a_model_exactly(tmp_path):
    """Prefill, page the K/V, gather it into fresh KVCaches: the next logits are the
    from-scratch logits, bit for bit. The same computation: the same K/V values in the
    same shapes through the same one-token forward; only the buffer holding them differs."""
    model, _ = load(str(write_tiny_model(tmp_path / "m", TinyModelSpec(num_layers=2))))
    layout = cache_layout(model)
    tokens = mx.array([[72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108]])
    caches = model.make_cache()
    model(tokens[:, :-1], cache=caches)
    n = tokens.shape[1] - 1
    pool = KVPagePool(layout, num_pages=6, page_size=PAGE)
    pages = [4, 1, 6]
    for spec in layout.paged:
        kv = cache_at(caches, spec.path)
        pool.write(layout.pool_index(*spec.path), pages, kv.keys[0, :, :n], kv.values[0, :, :n])
    restored = []
    for spec in layout.paged:
        cache = KVCache()
        cache.keys, cache.values = pool.gather(
            layout.pool_index(*spec.path), page_slots(pages, PAGE, n)
        )
        cache.offset = n
        restored.append(cache)
    logits = model(tokens[:, -1:], cache=restored)
    expected = model(tokens[:, -1:], cache=caches)
    assert_bitwise_equal(logits, expected)


def test_pure_recurrent_layout_has_an_empty_pool():
    layout = CacheLayout((CacheSpec(0, AUXILIARY, slot=0), CacheSpec(1, AUXILIARY, slot=1)))
    pool = KVPagePool(layout, num_pages=0, page_size=PAGE)
    assert pool.num_layers == 0 and pool.nbytes == 0
    assert pool_pages_for_budget(layout, PAGE, weight_bytes=0) == 0
    assert pool_pages_for_budget(layout, PAGE, weight_bytes=0, tokens=1000) == 0


# --- PageAllocator -----------------------------------------------------------------


@settings(deadline=None, database=None, max_examples=150)
@given(num_pages=st.integers(0, 12), data=st.data())
def test_allocator_matches_a_reference_counter(num_pages, data):
    allocator = PageAllocator(num_pages)
    counts: dict[int, int] = {}  # the reference: page -> count, referenced pages only
    for _ in range(data.draw(st.integers(0, 40), label="steps")):
        op = data.draw(st.sampled_from(["alloc", "incref", "decref"]), label="op")
        if op == "alloc":
            n = data.draw(st.integers(0, 6), label="n")
            pages = allocator.alloc(n)
            if n > num_pages - len(counts):
                assert pages is None
            else:
                assert len(pages) == len(set(pages)) == n
                assert all(1 <= p <= num_pages and p not in counts for p in pages)
                counts.update(dict.fromkeys(pages, 1))
        elif counts:
            pages = data.draw(st.lists(st.sampled_from(sorted(counts)), max_size=4), label="pages")
            if op == "incref":
                allocator.incref(pages)
                for p in pages:
                    counts[p] += 1
            else:
                pages = list(dict.fromkeys(pages))  # once each: never below zero
                allocator.decref(pages)
                for p in pages:
                    counts[p] -= 1
                    if not counts[p]:
                        del counts[p]
        allocator.check_invariants()
        assert allocator.used_pages == len(counts)
        assert allocator.free_pages == allocator.available() == num_pages - len(counts)
        assert all(allocator.refcount(p) == c for p, c in counts.items())


def test_decref_below_zero_is_a_bug():
    allocator = PageAllocator(3)
    pages = allocator.alloc(2)
    assert pages == [1, 2]
    allocator.decref(pages)
    with pytest.raises(AssertionError, match="decref of free page 1"):
        allocator.decref([1])
    with pytest.raises(AssertionError, match="incref of free page 3"):
        allocator.incref([3])
    allocator.check_invariants()


# --- budget ------------------------------------------------------------------------


def test_budget_from_a_token_count():
    layout = full_layout()
    pages = pool_pages_for_budget(layout, 16, weight_bytes=10**12, tokens=1000)
    assert pages == math.ceil(1000 / 16) == 63
    assert pool_pages_for_budget(layout, 16, weight_bytes=0, tokens=32) == 2


def test_budget_from_device_memory(monkeypatch):
    layout = full_layout()  # 2 layers * 2 (K, V) * 2 heads * 8 dims * 4 bytes = 256 B/token
    page_bytes = 256 * 16
    monkeypatch.setattr(pool_module, "device_memory_bytes", lambda: 10 * 2**30)
    pages = pool_pages_for_budget(layout, 16, weight_bytes=2**30, fraction=0.5, max_bytes=2**40)
    assert pages == (5 * 2**30 - 2**30) // page_bytes
    capped = pool_pages_for_budget(layout, 16, weight_bytes=2**30, fraction=0.5, max_bytes=2**20)
    assert capped == 2**20 // page_bytes  # the preallocation cap wins
    assert pool_pages_for_budget(layout, 16, weight_bytes=9 * 2**30) == MIN_POOL_PAGES


def test_device_memory_is_read():
    assert pool_module.device_memory_bytes() > 2**20


# -- RAM on demand: a pool in segments --


def test_a_grown_segment_takes_its_memory_at_its_first_write_in_place():
    """grow() hands out the pages at once; the segment's memory comes with the first
    write into it (zeros and the write in one evaluation, no second copy)."""
    heads, head_dim, page = 4, 64, 64
    pool = KVPagePool(
        full_layout(1, heads, head_dim), num_pages=1023, page_size=page, segment_pages=256
    )
    segment = pool.nbytes
    keys, values = random_kv(2 * page, heads, head_dim)
    mx.eval(keys, values)
    before = mx.get_active_memory()
    pages = pool.grow()
    assert pages == list(range(256, 512)) and pool.reserved_pages == 511
    assert mx.get_active_memory() - before < 0.1 * segment  # nothing taken yet
    mx.reset_peak_memory()
    pool.write(0, pages[:2], keys, values)
    assert mx.get_active_memory() - before > 0.9 * segment  # now it is
    assert mx.get_peak_memory() - before < 1.1 * segment  # and made in place
    assert_bitwise_equal(pool.gather(0, page_slots(pages[:2], page, 2 * page))[0], keys[None])
    assert_bitwise_equal(
        pool.gather(0, page_slots(pages[2:3], page, page))[0], mx.zeros_like(keys[None, :, :page])
    )


def test_a_pool_in_segments_reads_and_writes_like_a_whole_one():
    whole = KVPagePool(full_layout(), num_pages=9, page_size=PAGE)
    grown = KVPagePool(full_layout(), num_pages=9, page_size=PAGE, segment_pages=3)
    assert (grown.reserved_pages, whole.reserved_pages) == (2, 9)  # segment 0 holds the null page
    assert grown.nbytes * 10 == whole.nbytes * 3 == grown.budget_bytes * 3
    allocator = PageAllocator(9, grown.reserved_pages)
    while allocator.reserved < 9:
        allocator.add_pages(grown.grow())
        allocator.check_invariants()
    assert grown.grow() == [] and grown.reserved_pages == 9 and grown.nbytes == whole.nbytes
    pages = [2, 3, 4, 9, 5]  # runs that cross segment ends (3 | 6 | 9)
    keys, values = random_kv(len(pages) * PAGE - 1, seed=3)
    mid_keys, mid_values = random_kv(5, seed=4)
    for pool in (whole, grown):
        for layer in range(2):
            pool.write(layer, pages, keys, values)
            pool.write_slots(
                layer,
                [7 * PAGE + 3, 8 * PAGE, 8 * PAGE + 1, 1 * PAGE, 6 * PAGE + 2],
                mid_keys,
                mid_values,
            )
    slots = [
        9 * PAGE + 1,
        2 * PAGE,
        2 * PAGE + 3,
        3 * PAGE,
        7 * PAGE + 3,
        8 * PAGE + 1,
        1 * PAGE,
        5 * PAGE + 2,
    ]
    for layer in range(2):
        for a, b in zip(whole.gather(layer, slots), grown.gather(layer, slots)):
            assert_bitwise_equal(a, b)
        one_segment = [3 * PAGE, 3 * PAGE + 1, 4 * PAGE + 2]
        for a, b in zip(
            whole.gather(layer, mx.array(one_segment)), grown.gather(layer, one_segment)
        ):
            assert_bitwise_equal(a, b)
