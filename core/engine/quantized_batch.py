"""Quantized K/V in the decode batch: mlx-lm's ``BatchKVCache`` for ``QuantizedKVCache`` rows.

mlx-lm batches plain caches (``KVCache.merge`` makes a ``BatchKVCache``) but has no batch
form of its ``QuantizedKVCache``, so with ``--kv-bits`` (``kvcache.kv_format``) requests
could not decode together. :class:`BatchQuantizedKVCache` is that batch form: the rows'
packed words, scales and biases left-padded to one length, as ``BatchKVCache`` does with
plain K/V, with mlx-lm's ``bits`` and ``group_size`` on it, so mlx-lm's attention
dispatches to ``quantized_scaled_dot_product_attention`` (with the batch's causal mask
over the left padding). New tokens are quantized as ``QuantizedKVCache`` quantizes them,
token by token, so a row's K/V are the bytes it would hold alone. :func:`merge_rows`
merges any row caches the decode batch takes.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import QuantizedKVCache


def merge_rows(rows: list):
    """One batch cache of the rows' caches of one layer (``rows``: that layer's cache of
    each row): mlx-lm's own merge, or :class:`BatchQuantizedKVCache`'s for quantized rows."""
    if isinstance(rows[0], QuantizedKVCache):
        return BatchQuantizedKVCache.merge(rows)
    return rows[0].merge(rows)


def _map(fn, *sides):
    return tuple(fn(*arrays) for arrays in zip(*sides))


class BatchQuantizedKVCache:
    """Rows of quantized K/V, left-padded (see mlx-lm's ``BatchKVCache``): ``keys`` and
    ``values`` are each ``(packed, scales, biases)``, ``(rows, heads, capacity, width)``;
    ``idx`` positions are in use, ``left_padding[i]`` of them padding in row ``i``."""

    step = 256

    def __init__(self, left_padding: list[int], group_size: int, bits: int):
        self.keys = self.values = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-pad for pad in left_padding])
        self.idx = 0
        self.group_size, self.bits = group_size, bits

    # ------------------------------------------------------------ the forward's side
    def update_and_fetch(self, keys: mx.array, values: mx.array):
        rows, heads, n, _ = keys.shape
        prev = self.idx
        new_k = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        new_v = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        if self.keys is None or prev + n > self.keys[0].shape[2]:
            room = (self.step + n - 1) // self.step * self.step

            def grown(old, new):
                extra = mx.zeros((rows, heads, room, new.shape[3]), new.dtype)
                return extra if old is None else mx.concatenate([old[..., :prev, :], extra], 2)

            self.keys = _map(grown, self.keys or (None,) * 3, new_k)
            self.values = _map(grown, self.values or (None,) * 3, new_v)
        for store, new in zip(self.keys + self.values, new_k + new_v):
            store[..., prev : prev + n, :] = new
        self.offset = self.offset + n
        self.idx += n
        return self.keys_and_values()

    def keys_and_values(self):
        def cut(x):
            return x[..., : self.idx, :]

        return _map(cut, self.keys), _map(cut, self.values)

    def make_mask(self, n: int, return_array: bool = False, **kwargs):
        return create_causal_mask(n, offset=self.idx, left_padding=self.left_padding, **kwargs)

    @property
    def state(self):
        return self.keys, self.values, self.offset, self.left_padding

    # ------------------------------------------------------------ the batch's side
    def size(self) -> int:
        return self.idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else sum(a.nbytes for a in self.keys + self.values)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.idx, n)
        self.idx -= n
        self.offset = self.offset - n
        return n

    def filter(self, batch_indices) -> None:
        """Keep only the rows ``batch_indices`` (in place), dropping padding all share."""
        if self.keys is not None:
            self.keys = _map(lambda x: x[batch_indices], self.keys)
            self.values = _map(lambda x: x[batch_indices], self.values)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shared = min(self.left_padding.tolist())
        if shared > 0:
            if self.keys is not None:
                self.keys = _map(lambda x: x[..., shared:, :], self.keys)
                self.values = _map(lambda x: x[..., shared:, :], self.values)
            self.idx -= shared
            self.left_padding = self.left_padding - shared

    def extend(self, other: BatchQuantizedKVCache) -> None:
        """Add ``other``'s rows below these (in place), both right-aligned at the end."""
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        idx = max(self.idx, other.idx)
        length = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        like = self if self.keys is not None else other

        def padded(cache):
            rows = cache.offset.shape[0]
            sides = []
            for side, model in ((cache.keys, like.keys), (cache.values, like.values)):
                if side is None:
                    side = tuple(
                        mx.zeros((rows, m.shape[1], 0, m.shape[3]), m.dtype) for m in model
                    )
                left = idx - cache.idx
                right = length - side[0].shape[2] - left
                if right < 0:
                    side = tuple(x[..., :right, :] for x in side)
                    right = 0
                if left or right:
                    side = tuple(mx.pad(x, [(0, 0), (0, 0), (left, right), (0, 0)]) for x in side)
                sides.append(side)
            return sides[0], sides[1], cache.offset, cache.left_padding + (idx - cache.idx)

        (k1, v1, o1, p1), (k2, v2, o2, p2) = padded(self), padded(other)
        self.keys = _map(lambda a, b: mx.concatenate([a, b]), k1, k2)
        self.values = _map(lambda a, b: mx.concatenate([a, b]), v1, v2)
        self.offset = mx.concatenate([o1, o2])
        self.left_padding = mx.concatenate([p1, p2])
        self.idx = idx

    def extract(self, index: int) -> QuantizedKVCache:
        """Row ``index`` as a ``QuantizedKVCache`` of its own (padding dropped)."""
        cache = QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        pad = self.left_padding.tolist()[index]
        cache.keys = _map(
            lambda x: mx.contiguous(x[index : index + 1, :, pad : self.idx]), self.keys
        )
        cache.values = _map(
            lambda x: mx.contiguous(x[index : index + 1, :, pad : self.idx]), self.values
        )
        cache.offset = self.idx - pad
        return cache

    @classmethod
    def merge(cls, caches: list[QuantizedKVCache]) -> BatchQuantizedKVCache:
        """One batch of the rows ``caches``, each left-padded to the longest."""
        first = caches[0]
        lengths = [c.offset for c in caches]
        longest = max(lengths)
        batch = cls([longest - n for n in lengths], first.group_size, first.bits)
        if longest == 0:
            return batch
        model = next(c for c in caches if c.keys is not None)

        def stacked(side_of):
            out = tuple(
                mx.zeros((len(caches), x.shape[1], longest, x.shape[3]), x.dtype)
                for x in side_of(model)
            )
            for row, (n, cache) in enumerate(zip(lengths, caches)):
                if n:
                    for store, x in zip(out, side_of(cache)):
                        store[row : row + 1, :, longest - n :] = x[..., :n, :]
            return out

        batch.keys = stacked(lambda c: c.keys)
        batch.values = stacked(lambda c: c.values)
        batch.offset = batch.offset + longest
        batch.idx = longest
        return batch
