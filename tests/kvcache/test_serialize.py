"""K/V and snapshot blobs round-trip bit for bit; damaged blobs are refused."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.utils import load

from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.serialize import (
    SerializeError,
    kv_from_bytes,
    kv_to_bytes,
    snapshot_from_bytes,
    snapshot_to_bytes,
)
from kvcache.snapshot import detach_cache, take_snapshot


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_kv_round_trip_is_exact(dtype):
    layers = [(mx.random.normal((2, 5, 8)).astype(dtype), mx.random.normal((2, 5, 8)).astype(dtype))
              for _ in range(3)]
    back = kv_from_bytes(kv_to_bytes(layers), 3, 5)
    for (k, v), (k2, v2) in zip(layers, back):
        assert k2.dtype == dtype and mx.array_equal(k, k2) and mx.array_equal(v, v2)


def test_damaged_or_mismatched_kv_is_refused():
    blob = kv_to_bytes([(mx.zeros((1, 4, 2)), mx.zeros((1, 4, 2)))])
    with pytest.raises(SerializeError):
        kv_from_bytes(blob, 1, 5)  # another token count
    with pytest.raises(SerializeError):
        kv_from_bytes(blob[:-3], 1, 4)  # truncated
    with pytest.raises(SerializeError):
        kv_from_bytes(b"garbage" + blob, 1, 4)


@pytest.mark.parametrize("kind", ["sliding", "recurrent"])
def test_snapshot_round_trip_resumes_identically(kind, tmp_path):
    path = write_tiny_model(tmp_path / kind, TinyModelSpec(kind=kind, num_layers=4, sliding_window=8))
    model, _ = load(str(path))
    caches = model.make_cache()
    prompt = mx.array(list(range(30, 60)))[None]
    model(prompt, cache=caches)
    paths = tuple((i, None) for i, c in enumerate(caches) if type(c).__name__ != "KVCache")
    snap = take_snapshot(caches, paths, 30)
    back = snapshot_from_bytes(snapshot_to_bytes(snap))
    assert back.length == 30 and back.nbytes == snap.nbytes
    a, b = model.make_cache(), model.make_cache()
    # full layers are not in the snapshot: copy them over so both resume from 30 tokens
    for i, c in enumerate(caches):
        if (i, None) not in paths:
            a[i], b[i] = detach_cache(c), detach_cache(c)
    snap.restore_into(a)
    back.restore_into(b)
    nxt = mx.array([[7, 8, 9]])
    assert mx.array_equal(model(nxt, cache=a), model(nxt, cache=b))
