"""Bytes for the disk store: K/V of a run of tokens, and snapshots of hybrid layers.

A K/V blob is a small JSON header (format, token count, per-array shape and dtype) and
then the raw little-endian array bytes, K then V for every paged cache in pool order
(keys and values each in their own shape). Snapshots are the same for each snapshotted
cache object: its class, its path in the cache list, its plain attributes and its
arrays. Restoring gives back the exact bytes that were saved.
"""

from __future__ import annotations

import importlib
import json
import struct

import mlx.core as mx
import numpy as np

from kvcache.kv_pages import arrays_per_token, flatten, regroup
from kvcache.layout import CacheLayout
from kvcache.snapshot import Snapshot, detach_cache

_MAGIC = b"RCKV1\0"
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
    """A snapshot's caches: each one's class, its path in the cache list (``index``: the
    slot; ``member``: its place in a ``CacheList``, absent for a slot) and its attributes.
    Arrays, ``None`` and plain scalars go under ``arrays`` and ``plain`` as the first
    format had them; anything else (tuples, nested lists: a quantized cache's keys are a
    tuple of arrays) under ``values``, encoded by :func:`_encode`."""
    layers, arrays = [], []
    for (slot, member), cache in snapshot.layers:
        plain, slots, values = {}, {}, {}
        for name, value in vars(cache).items():
            if isinstance(value, mx.array):
                slots[name] = len(arrays)
                arrays.append(value)
            elif isinstance(value, list) and all(
                isinstance(v, mx.array) or v is None for v in value
            ):
                entry = []
                for item in value:
                    entry.append(None if item is None else len(arrays))
                    if item is not None:
                        arrays.append(item)
                slots[name] = entry
            elif value is None or isinstance(value, (int, float, str, bool)):
                plain[name] = value
            else:
                values[name] = _encode(value, arrays, f"{type(cache).__name__}.{name}")
        cls = type(cache)
        layer = {
            "index": slot,
            "class": f"{cls.__module__}:{cls.__qualname__}",
            "plain": plain,
            "arrays": slots,
        }
        if member is not None:
            layer["member"] = member
        if values:
            layer["values"] = values
        layers.append(layer)
    return pack_arrays({"kind": "snapshot", "length": snapshot.length, "layers": layers}, arrays)


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
    header, arrays = unpack_arrays(blob)
    if header.get("kind") != "snapshot":
        raise SerializeError("not a snapshot blob")
    layers = []
    try:
        for layer in header["layers"]:
            module, _, qualname = layer["class"].partition(":")
            if not module.startswith("mlx_lm."):
                raise SerializeError(f"unexpected cache class {layer['class']}")
            cls = getattr(importlib.import_module(module), qualname)
            cache = cls.__new__(cls)
            for name, value in layer["plain"].items():
                setattr(cache, name, value)
            for name, slot in layer["arrays"].items():
                setattr(
                    cache,
                    name,
                    [None if s is None else arrays[s] for s in slot]
                    if isinstance(slot, list)
                    else arrays[slot],
                )
            for name, value in layer.get("values", {}).items():
                setattr(cache, name, _decode(value, arrays))
            layers.append(((layer["index"], layer.get("member")), detach_cache(cache)))
    except (KeyError, IndexError, TypeError, AttributeError, ImportError) as exc:
        raise SerializeError(f"bad snapshot: {exc}") from exc
    nbytes = sum(a.nbytes for a in arrays)
    return Snapshot(header["length"], tuple(layers), nbytes)
