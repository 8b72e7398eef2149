"""The snapshot encoder of format 1, frozen as it was (RadixChat before issue 44.6), to
write stores of that format in tests: each snapshotted cache stored by its attributes
(``vars(cache)``: private names such as ``RotatingKVCache._idx`` included), and no
``format`` in the header. Do not change it: it stands for stores users already have."""

from __future__ import annotations

import mlx.core as mx

from kvcache.serialize import pack_arrays
from kvcache.snapshot import Snapshot


def old_snapshot_to_bytes(snapshot: Snapshot) -> bytes:
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
                values[name] = _encode(value, arrays)
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


def _encode(value, arrays: list):
    if isinstance(value, mx.array):
        arrays.append(value)
        return {"array": len(arrays) - 1}
    if value is None or isinstance(value, (int, float, str, bool)):
        return {"plain": value}
    if isinstance(value, (list, tuple)):
        kind = "tuple" if isinstance(value, tuple) else "list"
        return {kind: [_encode(v, arrays) for v in value]}
    raise ValueError(f"cannot save {type(value).__name__}")
