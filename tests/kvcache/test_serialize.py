"""K/V and snapshot blobs round-trip bit for bit; damaged blobs are refused; snapshots
go through mlx-lm's ``state`` / ``from_state``, and those of the first format still read."""

from __future__ import annotations

import struct

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import cache as mlx_cache
from mlx_lm.utils import load

from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.serialize import (
    SNAPSHOT_FORMAT,
    SerializeError,
    kv_from_bytes,
    kv_to_bytes,
    pack_arrays,
    snapshot_from_bytes,
    snapshot_to_bytes,
    unpack_arrays,
)
from kvcache.snapshot import cache_fields, detach_cache, take_snapshot
from tests.kvcache.old_snapshot_format import old_snapshot_to_bytes


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


# --- snapshots through mlx-lm's state / from_state (issue 44.6) ---------------------------


def hybrid_snapshot(kind: str, tmp_path):
    """A tiny ``kind`` model, its caches after a 30-token prompt (longer than the 8-token
    window: a sliding cache has rotated) and a snapshot of its unpaged caches."""
    path = write_tiny_model(
        tmp_path / kind, TinyModelSpec(kind=kind, num_layers=4, sliding_window=8)
    )
    model, _ = load(str(path))
    caches = model.make_cache()
    model(mx.array(list(range(30, 60)))[None], cache=caches)
    paths = tuple((i, None) for i, c in enumerate(caches) if type(c).__name__ != "KVCache")
    return model, caches, take_snapshot(caches, paths, 30)


def same_fields(a, b) -> bool:
    """Two states (or attribute dicts) equal value for value, arrays bit for bit and in dtype."""
    if isinstance(a, mx.array) or isinstance(b, mx.array):
        return (
            isinstance(a, mx.array)
            and isinstance(b, mx.array)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and np.array_equal(np.array(a.view(mx.uint8)), np.array(b.view(mx.uint8)))
        )
    if isinstance(a, (list, tuple)):
        return (
            type(a) is type(b) and len(a) == len(b) and all(same_fields(x, y) for x, y in zip(a, b))
        )
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_fields(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def header_of(blob: bytes) -> dict:
    return unpack_arrays(blob)[0]


@pytest.mark.parametrize("kind", ["sliding", "recurrent"])
def test_a_snapshot_is_stored_as_each_caches_state_with_no_attribute_names(kind, tmp_path):
    """Format 2: class, path and mlx-lm ``state``; no private attribute name of mlx-lm
    (``RotatingKVCache._idx``) in the blob, and ``from_state`` gives the bytes back."""
    _, _, snap = hybrid_snapshot(kind, tmp_path)
    blob = snapshot_to_bytes(snap)
    (size,) = struct.unpack_from("<I", blob, 6)
    text = blob[10 : 10 + size].decode()
    assert "_idx" not in text and '"plain": {' not in text
    header = header_of(blob)
    assert header["format"] == SNAPSHOT_FORMAT == 2
    assert all(set(layer) == {"index", "class", "state"} for layer in header["layers"])
    back = snapshot_from_bytes(blob)
    assert [p for p, _ in back.layers] == [p for p, _ in snap.layers] and back.nbytes == snap.nbytes
    for (_, saved), (_, restored) in zip(snap.layers, back.layers):
        assert type(restored) is type(saved)
        assert same_fields(cache_fields(saved), cache_fields(restored))
        assert set(vars(restored)) == set(vars(saved))  # from_state leaves nothing out


@pytest.mark.parametrize("kind", ["sliding", "recurrent"])
def test_a_snapshot_of_the_first_format_reads_as_the_same_state(kind, tmp_path):
    """A store written before format 2 (the frozen old encoder): the same caches come
    back, bit for bit, and the model resumes from them exactly as from the RAM snapshot."""
    model, caches, snap = hybrid_snapshot(kind, tmp_path)
    old = old_snapshot_to_bytes(snap)
    assert "format" not in header_of(old)
    back = snapshot_from_bytes(old)
    assert back.length == 30 and back.nbytes == snap.nbytes
    for (_, saved), (_, restored) in zip(snap.layers, back.layers):
        assert type(restored) is type(saved)
        assert same_fields(cache_fields(saved), cache_fields(restored))
    a, b = model.make_cache(), model.make_cache()
    for i, c in enumerate(caches):
        a[i], b[i] = detach_cache(c), detach_cache(c)
    snap.restore_into(a)
    back.restore_into(b)
    nxt = mx.array([[7, 8, 9]])
    assert mx.array_equal(model(nxt, cache=a), model(nxt, cache=b))


def old_rotating_blob(**plain) -> bytes:
    """A format-1 blob of one RotatingKVCache with these plain attributes."""
    return pack_arrays(
        {
            "kind": "snapshot",
            "length": 4,
            "layers": [
                {
                    "index": 0,
                    "class": "mlx_lm.models.cache:RotatingKVCache",
                    "plain": plain,
                    "arrays": {"keys": 0, "values": 1},
                }
            ],
        },
        [mx.ones((1, 2, 4, 8)), mx.ones((1, 2, 4, 8))],
    )


def test_a_first_format_snapshot_whose_fields_this_mlx_lm_does_not_keep_is_refused():
    """Never misread: a format-1 cache is rebuilt through ``from_state``, so a field the
    class's state needs that the blob lacks, or one it does not keep, is an error."""
    fields = dict(keep=0, offset=4, max_size=8, _idx=4)
    [(_, cache)] = snapshot_from_bytes(old_rotating_blob(**fields)).layers
    assert cache.state[2:] == (4, 0, 8, 4) and cache.size() == 4
    missing = {k: v for k, v in fields.items() if k != "_idx"}
    with pytest.raises(SerializeError, match="bad snapshot"):
        snapshot_from_bytes(old_rotating_blob(**missing))
    with pytest.raises(SerializeError, match="does not keep"):
        snapshot_from_bytes(old_rotating_blob(**fields, window_start=2))


def test_a_snapshot_of_a_newer_format_or_a_bad_state_is_refused(tmp_path):
    _, _, snap = hybrid_snapshot("sliding", tmp_path)
    header, arrays = unpack_arrays(snapshot_to_bytes(snap))
    with pytest.raises(SerializeError, match="format 3 .* newer RadixChat"):
        snapshot_from_bytes(pack_arrays({**header, "format": 3}, arrays))
    layer = header["layers"][0]
    short = {**layer, "state": {"tuple": layer["state"]["tuple"][:-1]}}  # one value missing
    with pytest.raises(SerializeError, match="bad snapshot"):
        snapshot_from_bytes(pack_arrays({**header, "layers": [short]}, arrays))


def test_every_cache_class_mlx_lm_rebuilds_keeps_all_its_fields_through_its_state():
    """What format 2 relies on, for every cache class a layout may snapshot: ``from_state``
    of a cache's ``state`` is the same object, field for field (a new mlx-lm whose state
    left something out fails here, not in a user's store)."""
    kv = mx.random.normal((1, 2, 5, 32))
    caches = []
    for cache in (
        mlx_cache.KVCache(),
        mlx_cache.RotatingKVCache(max_size=4, keep=1),
        mlx_cache.QuantizedKVCache(group_size=32, bits=8),
        mlx_cache.ChunkedKVCache(chunk_size=4),
        mlx_cache.ConcatenateKVCache(),
    ):
        cache.update_and_fetch(kv, kv)
        caches.append(cache)
    arrays = mlx_cache.ArraysCache(2)
    arrays[0] = mx.ones((1, 3))
    caches += [arrays, mlx_cache.CacheList(mlx_cache.ArraysCache(1), mlx_cache.KVCache())]
    for cache in caches:
        back = snapshot_from_bytes(snapshot_to_bytes(take_snapshot([cache], ((0, None),), 5)))
        [(_, restored)] = back.layers
        assert set(vars(restored)) == set(vars(cache)), type(cache).__name__
        assert same_fields(cache_fields(restored), cache_fields(cache)), type(cache).__name__


def test_a_cache_class_without_from_state_is_stored_by_its_attributes():
    """deepseek_v41's LayerCache has a ``state`` but no ``from_state``: it is kept by its
    attributes, and comes back the same."""
    from mlx_lm.models.deepseek_v41 import LayerCache

    cache = LayerCache(window_size=4)
    cache.update_window(mx.random.normal((1, 6, 8)))
    blob = snapshot_to_bytes(take_snapshot([cache], ((0, None),), 6))
    assert set(header_of(blob)["layers"][0]) == {"index", "class", "attributes"}
    [(_, restored)] = snapshot_from_bytes(blob).layers
    assert type(restored) is LayerCache and restored.offset == 6
    assert same_fields(vars(restored), vars(cache))
