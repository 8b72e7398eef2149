"""Snapshots of the layer state that paged K/V cannot rebuild.

Sliding-window caches (``RotatingKVCache``), recurrent / linear-attention state
(``ArraysCache`` and friends) and any other cache the pool cannot page (see
:mod:`kvcache.layout`) keep state that depends on the whole history in a way a per-token
KV page cannot express. At chosen token boundaries (the end of a prompt, the end of a
request) the engine copies those cache objects into a :class:`Snapshot`; a later request
that matches the prefix up to that boundary resumes from it, exactly. A cache is named by
its path in the model's cache list (``(slot, member)``, see :func:`kvcache.layout.cache_at`).

A cache is copied through mlx-lm's public protocol: its ``state`` (arrays and the plain
values beside them: offsets, window sizes) and the class's ``from_state``, as mlx-lm's
own ``save_prompt_cache`` / ``load_prompt_cache`` do. A cache class without
``from_state`` (mlx-lm 0.32's only one: ``deepseek_v41.LayerCache``, which is no
``_BaseCache``) is copied by its attributes instead (:func:`cache_fields`).

Copying is cheap: MLX updates arrays in place through ``__setitem__`` on the *same
Python object*, but a distinct array object sharing the buffer keeps its value (the
write copies the buffer instead of donating it). So a snapshot holds distinct array
objects for every array of the state, and a restore hands out distinct objects again.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from kvcache.layout import CachePath, cache_at, put_cache


def rebuilt_from_state(cls: type) -> bool:
    """Whether mlx-lm rebuilds a ``cls`` from its ``state`` (``cls.from_state``): every
    cache class of ``mlx_lm.models.cache``."""
    return callable(getattr(cls, "from_state", None))


def cache_fields(cache):
    """What defines ``cache``: mlx-lm's ``state`` (a tuple or list of arrays and plain
    values) or, for a class :func:`rebuilt_from_state` says no to, its attributes (a dict)."""
    if rebuilt_from_state(type(cache)):
        return cache.state
    return dict(vars(cache))


def rebuild_cache(cls: type, fields):
    """A ``cls`` holding ``fields`` (what :func:`cache_fields` gave for one)."""
    if rebuilt_from_state(cls):
        return cls.from_state(fields)
    cache = cls.__new__(cls)
    for name, value in fields.items():
        setattr(cache, name, value)
    return cache


def _detach_value(value):
    if isinstance(value, mx.array):
        return mx.array(value)
    if isinstance(value, list):
        return [_detach_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_detach_value(v) for v in value)
    if isinstance(value, dict):
        return {k: _detach_value(v) for k, v in value.items()}
    return value


def detach_cache(cache):
    """A copy of an mlx-lm cache object whose arrays are distinct objects (no data copied)."""
    return rebuild_cache(type(cache), _detach_value(cache_fields(cache)))


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
    mx.eval([state_arrays(cache_fields(cache_at(caches, path))) for path in paths])
    layers = tuple((path, detach_cache(cache_at(caches, path))) for path in paths)
    size = sum(a.nbytes for _, c in layers for a in state_arrays(cache_fields(c)))
    return Snapshot(length, layers, size)


def state_arrays(value) -> list[mx.array]:
    """The mx.arrays in ``value`` (lists, tuples and dicts searched)."""
    if isinstance(value, mx.array):
        return [value]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in state_arrays(v)]
    if isinstance(value, dict):
        return [a for v in value.values() for a in state_arrays(v)]
    return []
