"""Bytes for the disk store: K/V of a run of tokens, and snapshots of hybrid layers.

A K/V blob is a small JSON header (format, token count, per-array shape and dtype) and
then the raw little-endian array bytes, K then V for every paged cache in pool order
(keys and values each in their own shape). A snapshot is the same container: for each
snapshotted cache object its class, its path in the cache list and its mlx-lm ``state``
(arrays by position, plain values in the header), rebuilt with the class's
``from_state`` as mlx-lm's ``save_prompt_cache`` / ``load_prompt_cache`` do; the header's
``format`` says which way it was written (no ``format``: the first way, each cache's
attributes by name, still read). Restoring gives back the exact bytes that were saved.
"""

from __future__ import annotations

import importlib
import json
import struct

import mlx.core as mx
import numpy as np

from kvcache.kv_pages import arrays_per_token, flatten, regroup
from kvcache.layout import CacheLayout
from kvcache.snapshot import Snapshot, cache_fields, rebuild_cache, rebuilt_from_state

_MAGIC = b"RCKV1\0"
# Snapshots: 1 stored each cache's attributes by name (read by _layer_v1); 2 its mlx-lm state
SNAPSHOT_FORMAT = 2
_NUMPY_DTYPES = {
    name: getattr(np, name)
    for name in (
        "float32",
        "float16",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
    )
}
_NUMPY_DTYPES["bool"] = np.bool_


class SerializeError(ValueError):
    """A blob that does not decode (damaged, or written for another layout)."""


def _to_numpy(array: mx.array) -> tuple[str, np.ndarray]:
    name = str(array.dtype).split(".")[-1]
    if name == "bfloat16":  # numpy has no bfloat16: keep the raw 16-bit pattern
        return name, np.array(array.view(mx.uint16))
    return name, np.array(array)


def _numpy_view(name: str, shape: list[int], raw: memoryview) -> np.ndarray:
    """The bytes as a numpy array without a copy (bfloat16 as its raw 16-bit pattern)."""
    if name == "bfloat16":
        return np.frombuffer(raw, np.uint16).reshape(shape)
    if name not in _NUMPY_DTYPES:
        raise SerializeError(f"unknown dtype {name}")
    return np.frombuffer(raw, _NUMPY_DTYPES[name]).reshape(shape)


def from_numpy(name: str, data: np.ndarray) -> mx.array:
    """An mx.array of dtype ``name`` from what ``_numpy_view`` gives (one copy)."""
    array = mx.array(data)
    return array.view(mx.bfloat16) if name == "bfloat16" else array


def pack_arrays(header: dict, arrays: list[mx.array]) -> bytes:
    parts, specs = [], []
    for array in arrays:
        name, data = _to_numpy(array)
        specs.append({"dtype": name, "shape": list(data.shape), "nbytes": data.nbytes})
        parts.append(data.tobytes())
    head = json.dumps({**header, "arrays": specs}).encode()
    return _MAGIC + struct.pack("<I", len(head)) + head + b"".join(parts)


def unpack_arrays(blob: bytes) -> tuple[dict, list[mx.array]]:
    header, views = _unpack_views(blob)
    return header, [from_numpy(name, view) for name, view in views]


def _unpack_views(blob: bytes) -> tuple[dict, list[tuple[str, np.ndarray]]]:
    """The header and each array as (dtype name, zero-copy numpy view of ``blob``)."""
    if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + 4:
        raise SerializeError("not a RadixChat KV blob")
    (size,) = struct.unpack_from("<I", blob, len(_MAGIC))
    start = len(_MAGIC) + 4
    try:
        header = json.loads(blob[start : start + size])
    except ValueError as exc:
        raise SerializeError(f"bad header: {exc}") from exc
    view, offset, arrays = memoryview(blob), start + size, []
    for spec in header.pop("arrays"):
        end = offset + spec["nbytes"]
        if end > len(blob):
            raise SerializeError("blob is shorter than its header says")
        arrays.append((spec["dtype"], _numpy_view(spec["dtype"], spec["shape"], view[offset:end])))
        offset = end
    return header, arrays


def kv_to_bytes(layers: list[tuple]) -> bytes:
    """K/V of ``n`` tokens for every paged cache, each ``(heads, n, dim)`` (K and V may differ;
    a quantized side is its three arrays, written as they are: ``kvcache.kv_format``)."""
    arrays = flatten(layers)
    n = arrays[0].shape[1] if arrays else 0
    return pack_arrays({"kind": "kv", "tokens": n}, arrays)


def kv_from_bytes(
    blob: bytes, num_layers: int, num_tokens: int, layout: CacheLayout | None = None
) -> list[tuple]:
    """What :func:`kv_to_bytes` wrote: ``(keys, values)`` per layer (with ``layout``, each
    side in its stored format; without, one array a side)."""
    count = arrays_per_token(layout) if layout is not None else 2 * num_layers
    arrays = [from_numpy(*view) for view in kv_views(blob, count, num_tokens, arrays=True)]
    if layout is not None:
        return regroup(arrays, layout)
    return list(zip(arrays[0::2], arrays[1::2]))


def kv_views(
    blob: bytes, count: int, num_tokens: int, arrays: bool = False
) -> list[tuple[str, np.ndarray]]:
    """Every array (K then V of every layer, each side's parts in order) as (dtype name,
    zero-copy numpy view of ``blob``): a restore joins many pages' views into one buffer per
    array before anything reaches MLX. ``count``: the layers (two arrays each), or with
    ``arrays`` the arrays themselves (a quantized side has three)."""
    header, views = _unpack_views(blob)
    if (
        header.get("kind") != "kv"
        or header.get("tokens") != num_tokens
        or len(views) != (count if arrays else 2 * count)
    ):
        raise SerializeError("K/V blob does not match this page")
    return views


def snapshot_to_bytes(snapshot: Snapshot) -> bytes:
    """A snapshot's caches (format 2): each one's class, its path in the cache list
    (``index``: the slot; ``member``: its place in a ``CacheList``, absent for a slot) and
    its mlx-lm ``state`` (``from_state`` rebuilds it), encoded by :func:`_encode`; a class
    without ``from_state`` keeps its ``attributes`` instead (:mod:`kvcache.snapshot`)."""
    layers, arrays = [], []
    for (slot, member), cache in snapshot.layers:
        cls = type(cache)
        layer = {"index": slot, "class": f"{cls.__module__}:{cls.__qualname__}"}
        if member is not None:
            layer["member"] = member
        fields = cache_fields(cache)
        if rebuilt_from_state(cls):
            layer["state"] = _encode(fields, arrays, cls.__name__)
        else:
            layer["attributes"] = {
                name: _encode(value, arrays, f"{cls.__name__}.{name}")
                for name, value in fields.items()
            }
        layers.append(layer)
    header = {
        "kind": "snapshot",
        "format": SNAPSHOT_FORMAT,
        "length": snapshot.length,
        "layers": layers,
    }
    return pack_arrays(header, arrays)


def _encode(value, arrays: list, what: str):
    """A JSON-able form of ``value`` (arrays appended to ``arrays``, named by position)."""
    if isinstance(value, mx.array):
        arrays.append(value)
        return {"array": len(arrays) - 1}
    if value is None or isinstance(value, (int, float, str, bool)):
        return {"plain": value}
    if isinstance(value, (list, tuple)):
        return {
            "tuple" if isinstance(value, tuple) else "list": [
                _encode(v, arrays, what) for v in value
            ]
        }
    raise SerializeError(f"cannot save {what} ({type(value).__name__})")


def _decode(encoded, arrays: list):
    if not isinstance(encoded, dict) or len(encoded) != 1:
        raise SerializeError("bad snapshot value")
    ((kind, value),) = encoded.items()
    if kind == "array":
        return arrays[value]
    if kind == "plain":
        return value
    if kind in ("list", "tuple"):
        items = [_decode(v, arrays) for v in value]
        return tuple(items) if kind == "tuple" else items
    raise SerializeError(f"bad snapshot value kind {kind!r}")


def snapshot_from_bytes(blob: bytes) -> Snapshot:
    """What :func:`snapshot_to_bytes` wrote, or a snapshot of format 1 (stores written
    before format 2: each cache's attributes by name, :func:`_layer_v1`)."""
    header, arrays = unpack_arrays(blob)
    if header.get("kind") != "snapshot":
        raise SerializeError("not a snapshot blob")
    version = header.get("format", 1)
    if version not in (1, SNAPSHOT_FORMAT):
        raise SerializeError(
            f"snapshot format {version!r} is not one this version reads "
            f"(1 to {SNAPSHOT_FORMAT}): written by a newer RadixChat"
        )
    read = _layer_v1 if version == 1 else _layer
    try:
        layers = tuple(
            ((layer["index"], layer.get("member")), read(layer, arrays))
            for layer in header["layers"]
        )
        length = header["length"]
    except SerializeError:
        raise
    except (KeyError, IndexError, TypeError, AttributeError, ImportError, ValueError) as exc:
        raise SerializeError(f"bad snapshot: {exc}") from exc
    return Snapshot(length, layers, sum(a.nbytes for a in arrays))


def _cache_class(name: str) -> type:
    """The mlx-lm cache class named ``module:qualname``."""
    module, _, qualname = name.partition(":")
    if not module.startswith("mlx_lm."):
        raise SerializeError(f"unexpected cache class {name}")
    cls = getattr(importlib.import_module(module), qualname)
    if not isinstance(cls, type):
        raise SerializeError(f"unexpected cache class {name}")
    return cls


def _layer(layer: dict, arrays: list):
    """One cache of a format-2 snapshot: rebuilt by its class's ``from_state`` (or, saved
    by its attributes, by :func:`_from_attributes`)."""
    cls = _cache_class(layer["class"])
    if "state" not in layer:
        attributes = {name: _decode(v, arrays) for name, v in layer["attributes"].items()}
        return _from_attributes(cls, attributes)
    if not rebuilt_from_state(cls):
        raise SerializeError(f"{cls.__name__} has no from_state in this mlx-lm")
    return rebuild_cache(cls, _decode(layer["state"], arrays))


def _layer_v1(layer: dict, arrays: list):
    """One cache of a format-1 snapshot, decoded as that format was: its attributes
    (``plain`` scalars, ``arrays`` by position, other ``values`` encoded)."""
    attributes = dict(layer["plain"])
    for name, slot in layer["arrays"].items():
        attributes[name] = (
            [None if s is None else arrays[s] for s in slot]
            if isinstance(slot, list)
            else arrays[slot]
        )
    for name, value in layer.get("values", {}).items():
        attributes[name] = _decode(value, arrays)
    return _from_attributes(_cache_class(layer["class"]), attributes)


def _from_attributes(cls: type, attributes: dict):
    """A ``cls`` with ``attributes`` set. A class mlx-lm rebuilds from its state is then
    rebuilt through ``from_state`` from that object's ``state``: attributes that are not
    exactly those this mlx-lm's class keeps are refused (the prefix is recomputed), never
    misread."""
    cache = cls.__new__(cls)
    for name, value in attributes.items():
        setattr(cache, name, value)
    if not rebuilt_from_state(cls):
        return cache
    rebuilt = rebuild_cache(cls, cache_fields(cache))
    if set(vars(rebuilt)) != set(attributes):
        raise SerializeError(
            f"a {cls.__name__} snapshot with fields this mlx-lm's {cls.__name__} "
            f"does not keep ({', '.join(sorted(attributes))})"
        )
    return rebuilt
