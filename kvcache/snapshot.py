"""Snapshots of the layer state that paged K/V cannot rebuild.

Sliding-window layers (``RotatingKVCache``) and recurrent / linear-attention layers
(``ArraysCache`` and friends) keep state that depends on the whole history in a way a
per-token KV page cannot express. At chosen token boundaries (the end of a prompt, the
end of a request) the engine copies those layers' cache objects into a
:class:`Snapshot`; a later request that matches the prefix up to that boundary resumes
from it, exactly.

Copying is cheap: MLX updates arrays in place through ``__setitem__`` on the *same
Python object*, but a distinct array object sharing the buffer keeps its value (the
write copies the buffer instead of donating it). So a snapshot holds distinct array
objects for every array attribute, and a restore hands out distinct objects again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import mlx.core as mx


def _detach_value(value):
    if isinstance(value, mx.array):
        return mx.array(value)
    if isinstance(value, list):
        return [_detach_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_detach_value(v) for v in value)
    return value


def detach_cache(cache):
    """A copy of an mlx-lm cache object whose arrays are distinct objects (no data copied)."""
    clone = copy.copy(cache)
    for name, value in vars(cache).items():
        setattr(clone, name, _detach_value(value))
    return clone


def _nbytes(value) -> int:
    if isinstance(value, mx.array):
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


@dataclass(frozen=True)
class Snapshot:
    """The cache objects of the non-paged layers at one token boundary."""

    length: int  # tokens the state covers
    layers: tuple[tuple[int, object], ...]  # (layer index, detached cache object)
    nbytes: int

    def restore_into(self, caches: list) -> None:
        """Put this snapshot's state into ``caches`` (a model's cache list), layer by layer."""
        for index, cache in self.layers:
            caches[index] = detach_cache(cache)


def take_snapshot(caches: list, layer_indices: tuple[int, ...], length: int) -> Snapshot:
    """Snapshot ``caches[i]`` for every ``i`` in ``layer_indices`` (evaluated first)."""
    mx.eval([caches[i].state for i in layer_indices])
    layers = tuple((i, detach_cache(caches[i])) for i in layer_indices)
    size = sum(_nbytes(list(vars(c).values())) for _, c in layers)
    return Snapshot(length, layers, size)
