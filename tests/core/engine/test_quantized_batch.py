"""core.engine.quantized_batch: quantized rows merged, extended, filtered and extracted
keep their bytes; a batch decodes what its rows decode alone."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from core.engine.quantized_batch import BatchQuantizedKVCache, merge_rows


def row(n: int, seed: int, bits: int = 8) -> QuantizedKVCache:
    cache = QuantizedKVCache(group_size=32, bits=bits)
    keys, values = mx.random.normal((2, 1, 2, n, 64), key=mx.random.key(seed))
    cache.update_and_fetch(keys, values)
    return cache


def same(a, b) -> bool:
    return all(x.shape == y.shape and mx.array_equal(x, y).item() for x, y in zip(a, b))


def trimmed(cache: QuantizedKVCache):
    return [x[..., : cache.offset, :] for x in (*cache.keys, *cache.values)]


def test_rows_come_back_out_as_they_went_in():
    rows = [row(5, 1), row(9, 2)]
    batch = merge_rows(rows)
    assert isinstance(batch, BatchQuantizedKVCache) and batch.size() == 9
    assert batch.left_padding.tolist() == [4, 0]
    for i, original in enumerate(rows):
        assert same(trimmed(batch.extract(i)), trimmed(original))
    other = merge_rows([row(3, 3)])
    batch.extend(other)
    assert batch.left_padding.tolist() == [4, 0, 6]
    assert same(trimmed(batch.extract(2)), trimmed(row(3, 3)))
    batch.filter([0, 2])  # the longest row leaves: the padding all share goes
    assert batch.size() == 5 and batch.left_padding.tolist() == [0, 2]
    assert same(trimmed(batch.extract(0)), trimmed(rows[0]))


def test_new_tokens_are_quantized_as_each_row_quantizes_them():
    rows = [row(4, 5), row(7, 6)]
    batch = merge_rows([row(4, 5), row(7, 6)])
    keys, values = mx.random.normal((2, 2, 2, 1, 64), key=mx.random.key(7))
    batch.update_and_fetch(keys, values)
    for i, alone in enumerate(rows):
        alone.update_and_fetch(keys[i : i + 1], values[i : i + 1])
        assert same(trimmed(batch.extract(i)), trimmed(alone))
    mask = batch.make_mask(1, return_array=True)
    # the next token's mask: every position so far and itself; row 0 never sees its padding
    assert mask.shape[-1] == batch.size() + 1 and not mask[0, 0, 0, 0].item()


def test_plain_rows_keep_mlx_lms_own_merge():
    plain = KVCache()
    plain.update_and_fetch(*mx.zeros((2, 1, 2, 3, 8)))
    assert type(merge_rows([plain])).__name__ == "BatchKVCache"
