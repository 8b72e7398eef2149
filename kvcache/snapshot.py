"""Snapshots of the layer state that paged K/V cannot rebuild.

Sliding-window caches (``RotatingKVCache``), recurrent / linear-attention state
(``ArraysCache`` and friends) and any other cache the pool cannot page (see
:mod:`kvcache.layout`) keep state that depends on the whole history in a way a per-token
KV page cannot express. At chosen token boundaries (the end of a prompt, the end of a
request) the engine copies those cache objects into a :class:`Snapshot`; a later request
that matches the prefix up to that boundary resumes from it, exactly. A cache is named by
its path in the model's cache list (``(slot, member)``, see :func:`kvcache.layout.cache_at`).

Copying is cheap: MLX updates arrays in place through ``__setitem__`` on the *same
Python object*, but a distinct array object sharing the buffer keeps its value (the
write copies the buffer instead of donating it). So a snapshot holds distinct array
objects for every array attribute, and a restore hands out distinct objects again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import mlx.core as mx

from kvcache.layout import CachePath, cache_at, put_cache


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
    """The cache objects that are not paged, at one token boundary."""

    length: int  # tokens the state covers
    layers: tuple[tuple[CachePath, object], ...]  # (path in the cache list, detached cache object)
    nbytes: int

    def restore_into(self, caches: list) -> None:
        """Put this snapshot's state into ``caches`` (a model's cache list), cache by cache."""
        for path, cache in self.layers:
            put_cache(caches, path, detach_cache(cache))


def take_snapshot(caches: list, paths: tuple[CachePath, ...], length: int) -> Snapshot:
    """Snapshot the cache at every one of ``paths`` of ``caches`` (evaluated first)."""
    mx.eval([_arrays(vars(cache_at(caches, path)).values()) for path in paths])
    layers = tuple((path, detach_cache(cache_at(caches, path))) for path in paths)
    size = sum(_nbytes(list(vars(c).values())) for _, c in layers)
    return Snapshot(length, layers, size)


def _arrays(values) -> list:
    """The mx.arrays in ``values`` (lists and tuples searched)."""
    found = []
    for value in values:
        if isinstance(value, mx.array):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += _arrays(value)
    return found
