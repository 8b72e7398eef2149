"""Joining restored pages into one buffer per K/V array: what a restore from the disk tier
(kvcache/persist.py) builds a request's caches from."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvcache.kv_pages import flatten


class Joiner:
    """Each layer's K and V arrays (a quantized side's three as they are), joined along the
    tokens into one zeroed ``(heads, length, dim)`` MLX buffer each (the tail is spare
    room), page by page as a restore streams them.

    Pages are copied straight into the evaluated MLX buffers through numpy views (an MLX
    array exposes its memory, and these are referenced nowhere else yet): one copy into
    memory touched once, while the store reads the next pages."""

    def __init__(self, arrays: int, length: int):
        self.arrays, self.length = arrays, length
        self.buffers: list[mx.array] = []
        self.names: list[str] = []
        self.targets: list[np.ndarray] = []

    def add(self, at: int, n: int, lo: int, views: list) -> None:
        """Tokens ``lo..lo+n-1`` of a page (its K/V views, every layer) go to ``at..at+n-1``."""
        if not self.buffers:
            for name, first in views[: self.arrays]:
                dtype = mx.uint16 if name == "bfloat16" else getattr(mx, name)  # bfloat16: its bits
                self.buffers.append(
                    mx.zeros((first.shape[0], self.length, first.shape[2]), dtype=dtype)
                )
                self.names.append(name)
            mx.eval(self.buffers)
            self.targets = [np.array(buffer, copy=False) for buffer in self.buffers]  # views
        for target, (_, view) in zip(self.targets, views):
            target[:, at : at + n] = view[:, lo : lo + n]

    def add_arrays(self, at: int, layers_kv: list[tuple]) -> None:
        """Each layer's ``(keys, values)``, ``(heads, n, head_dim)`` MLX arrays (or a
        quantized side's three), go to ``at..at+n-1`` (after the first :meth:`add`: the
        buffers exist)."""
        arrays = flatten(layers_kv)
        arrays = [
            a.astype(mx.bfloat16).view(mx.uint16) if name == "bfloat16" else a.astype(buffer.dtype)
            # as the buffers hold it
            for a, name, buffer in zip(arrays, self.names, self.buffers)
        ]
        mx.eval(arrays)
        self.add(
            at,
            arrays[0].shape[1],
            0,
            [(name, np.array(a, copy=False)) for a, name in zip(arrays, self.names)],
        )

    def joined(self) -> list[mx.array]:
        """The joined arrays, in the order pages hold them; [] when nothing was added."""
        self.targets = []
        return [
            b.view(mx.bfloat16) if name == "bfloat16" else b
            for b, name in zip(self.buffers, self.names)
        ]
