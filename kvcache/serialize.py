"""Bytes for the disk store: K/V of a run of tokens, and snapshots of hybrid layers.

A K/V blob is a small JSON header (format, token count, per-layer shape and dtype) and
then the raw little-endian array bytes, K then V for every full-attention layer in pool
order. Snapshots are the same for each snapshotted layer's cache object: its class, its
plain attributes and its arrays. Restoring gives back the exact bytes that were saved.
"""

from __future__ import annotations

import importlib
import json
import struct

import mlx.core as mx
import numpy as np

from kvcache.snapshot import Snapshot, detach_cache

_MAGIC = b"RCKV1\0"
_NUMPY_DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "int32": np.int32,
    "uint32": np.uint32,
    "int64": np.int64,
    "bool": np.bool_,
}


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


def kv_to_bytes(layers: list[tuple[mx.array, mx.array]]) -> bytes:
    """K/V of ``n`` tokens for every full-attention layer, each ``(heads, n, head_dim)``."""
    n = layers[0][0].shape[1] if layers else 0
    return pack_arrays({"kind": "kv", "tokens": n}, [a for pair in layers for a in pair])


def kv_from_bytes(blob: bytes, num_layers: int, num_tokens: int) -> list[tuple[mx.array, mx.array]]:
    views = kv_views(blob, num_layers, num_tokens)
    return [
        (from_numpy(views[2 * i][0], views[2 * i][1]), from_numpy(*views[2 * i + 1]))
        for i in range(num_layers)
    ]


def kv_views(blob: bytes, num_layers: int, num_tokens: int) -> list[tuple[str, np.ndarray]]:
    """K then V of every layer as (dtype name, zero-copy numpy view of ``blob``): a restore
    joins many pages' views into one buffer per layer before anything reaches MLX."""
    header, views = _unpack_views(blob)
    if (
        header.get("kind") != "kv"
        or header.get("tokens") != num_tokens
        or len(views) != 2 * num_layers
    ):
        raise SerializeError("K/V blob does not match this page")
    return views


def snapshot_to_bytes(snapshot: Snapshot) -> bytes:
    layers, arrays = [], []
    for index, cache in snapshot.layers:
        plain, slots = {}, {}
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
                raise SerializeError(f"cannot save {type(cache).__name__}.{name}")
        cls = type(cache)
        layers.append(
            {
                "index": index,
                "class": f"{cls.__module__}:{cls.__qualname__}",
                "plain": plain,
                "arrays": slots,
            }
        )
    return pack_arrays({"kind": "snapshot", "length": snapshot.length, "layers": layers}, arrays)


def snapshot_from_bytes(blob: bytes) -> Snapshot:
    header, arrays = unpack_arrays(blob)
    if header.get("kind") != "snapshot":
        raise SerializeError("not a snapshot blob")
    layers = []
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
        layers.append((layer["index"], detach_cache(cache)))
    nbytes = sum(a.nbytes for a in arrays)
    return Snapshot(header["length"], tuple(layers), nbytes)
