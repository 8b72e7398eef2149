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
    layers = [
        (mx.random.normal((2, 5, 8)).astype(dtype), mx.random.normal((2, 5, 8)).astype(dtype))
        for _ in range(3)
    ]
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
    path = write_tiny_model(
        tmp_path / kind, TinyModelSpec(kind=kind, num_layers=4, sliding_window=8)
    )
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
    # the same computation: the same forward on the same state, once as taken, once read back
    assert mx.array_equal(model(nxt, cache=a), model(nxt, cache=b))


def test_snapshots_of_cache_list_members_and_tuple_attributes_round_trip():
    """A CacheList member is named by (slot, member); a quantized cache keeps its keys as a
    tuple of arrays (data, scales, biases): both come back as they were."""
    from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, QuantizedKVCache

    quantized = QuantizedKVCache(group_size=32, bits=8)
    quantized.update_and_fetch(mx.random.normal((1, 2, 5, 32)), mx.random.normal((1, 2, 5, 32)))
    state = ArraysCache(2)
    state[0], state[1] = mx.random.normal((1, 3, 8)), mx.arange(4)
    caches = [CacheList(state, KVCache()), quantized]
    snap = take_snapshot(caches, ((0, 0), (1, None)), 5)
    back = snapshot_from_bytes(snapshot_to_bytes(snap))
    assert [path for path, _ in back.layers] == [(0, 0), (1, None)] and back.length == 5
    restored = [CacheList(ArraysCache(2), KVCache()), QuantizedKVCache(group_size=32, bits=8)]
    back.restore_into(restored)
    assert restored[0].caches[1] is not None and isinstance(restored[0].caches[0], ArraysCache)
    assert all(
        mx.array_equal(a, b).item() for a, b in zip(restored[0].caches[0].cache, state.cache)
    )
    keys = restored[1].keys
    assert isinstance(keys, tuple) and len(keys) == 3
    assert all(
        mx.array_equal(a, b).item() and a.dtype == b.dtype for a, b in zip(keys, quantized.keys)
    )
    assert restored[1].offset == 5 and restored[1].bits == 8


def test_a_snapshot_written_before_cache_paths_still_reads():
    """A blob of the first format names only the layer's index (= its slot)."""
    from kvcache.serialize import pack_arrays

    blob = pack_arrays(
        {
            "kind": "snapshot",
            "length": 3,
            "layers": [
                {
                    "index": 2,
                    "class": "mlx_lm.models.cache:ArraysCache",
                    "plain": {"left_padding": None, "lengths": None},
                    "arrays": {"cache": [0, None]},
                }
            ],
        },
        [mx.ones((1, 2))],
    )
    snap = snapshot_from_bytes(blob)
    [(path, cache)] = snap.layers
    assert (
        path == (2, None)
        and mx.array_equal(cache.cache[0], mx.ones((1, 2))).item()
        and cache.cache[1] is None
    )


def test_a_snapshot_with_a_bad_layer_is_a_serialize_error():
    from kvcache.serialize import pack_arrays

    blob = pack_arrays(
        {
            "kind": "snapshot",
            "length": 3,
            "layers": [
                {
                    "index": 0,
                    "class": "mlx_lm.models.cache:ArraysCache",
                    "plain": {},
                    "arrays": {"cache": [5]},
                }
            ],
        },
        [],
    )
    with pytest.raises(SerializeError, match="bad snapshot"):
        snapshot_from_bytes(blob)
