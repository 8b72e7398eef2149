"""kvcache.kv_pages: quantized K/V in the pool, the tree and the disk tier, bit for bit;
where the format applies and where a cache keeps its own; the store's fingerprint."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, QuantizedKVCache
from mlx_lm.utils import load

from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.builder import build_kv_cache
from kvcache.kv_format import FULL_PRECISION, KVFormat
from kvcache.kv_pages import formats_by_kind, fresh_caches, store_fingerprint
from kvcache.layout import FULL, CacheLayout, CacheSpec, cache_at
from kvcache.persist import DiskTier
from kvcache.pool import KVPagePool
from kvcache.prefix_cache import PrefixCache
from kvcache.serialize import kv_from_bytes, kv_to_bytes

FP = "b" * 64
SPECS = {  # head dim 32: the group sizes 32 divides
    "llama": TinyModelSpec(kind="llama", num_layers=2, hidden_size=128),
    "sliding": TinyModelSpec(kind="sliding", num_layers=4, hidden_size=128, sliding_window=16),
    "recurrent": TinyModelSpec(kind="recurrent", num_layers=4, hidden_size=128),
}
Q8, Q4 = KVFormat(8, 32), KVFormat(4, 32)


@pytest.fixture(scope="module", params=sorted(SPECS))
def model(request, tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp(request.param) / "m", SPECS[request.param])
    return load(str(path))[0]


def prefix_cache(model, kv_format: KVFormat) -> PrefixCache:
    build = build_kv_cache(
        model, weight_bytes=0, page_size=8, pool_tokens=4096, kv_format=kv_format
    )
    return PrefixCache(model, build)


def computed(model, pc: PrefixCache, tokens: list[int]):
    """The request caches (in the pool's format) holding ``tokens``, and the snapshot at
    their end (hybrid models)."""
    caches = pc.fresh_caches()
    model(mx.array(tokens)[None], cache=caches)
    mx.eval([c.state for c in caches])
    snap = pc.snapshot(caches, len(tokens))
    return caches, [snap] if snap is not None else []


def quantized_layout(bits: int = 8, group: int = 32, dim: int = 64) -> CacheLayout:
    return CacheLayout(
        tuple(
            CacheSpec(
                i,
                FULL,
                slot=i,
                key_heads=2,
                key_dim=dim,
                value_heads=2,
                value_dim=dim,
                dtype="float32",
                bits=bits,
                group_size=group,
            )  # fmt: skip
            for i in range(2)
        )
    )


def assert_same(a, b) -> None:
    a, b = (tuple(x) if isinstance(x, (tuple, list)) else (x,) for x in (a, b))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert mx.array_equal(x, y).item()


# ---------------------------------------------------------------- the pool
@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_pages_round_trip_through_the_pool_bit_exact(bits):
    layout = quantized_layout(bits)
    pool = KVPagePool(layout, num_pages=8, page_size=4)
    keys = mx.quantize(mx.random.normal((2, 10, 64), key=mx.random.key(1)), 32, bits)
    values = mx.quantize(mx.random.normal((2, 10, 64), key=mx.random.key(2)), 32, bits)
    pool.write(1, [3, 4, 5], keys, values)  # whole pages, a partial last one
    pool.write_tokens(1, [3, 4, 5], 10, *(tuple(x[:, :2] for x in side) for side in (keys, values)))
    got_k, got_v = pool.gather(1, [3 * 4 + i for i in range(10)])
    assert_same(tuple(x[0] for x in got_k), keys)
    assert_same(tuple(x[0] for x in got_v), values)
    # the null page stays zero; every array of a side is paged
    assert all(not mx.any(a[0]).item() for a in pool.keys[1] + pool.values[1])
    assert isinstance(pool.keys[0], tuple) and len(pool.keys[0]) == 3


def test_a_write_in_the_wrong_format_is_refused():
    pool = KVPagePool(quantized_layout(8), num_pages=4, page_size=4)
    plain = mx.zeros((2, 4, 64))
    with pytest.raises(ValueError, match="arrays"):
        pool.write(0, [1], plain, plain)


def test_quantized_pages_hold_more_tokens_in_the_same_budget():
    """Bytes per token as stored: float32 K/V of head dim 64 is 256 bytes a head and side;
    8-bit is 64 bytes of words and a float32 scale and bias per group of 32 (80); 4-bit 48."""
    full = CacheLayout(
        tuple(
            CacheSpec(
                i,
                FULL,
                slot=i,
                key_heads=2,
                key_dim=64,
                value_heads=2,
                value_dim=64,
                dtype="float32",
            )  # fmt: skip
            for i in range(2)
        )
    )
    heads_sides = 2 * 2 * 2  # layers x heads x (K, V)
    assert full.bytes_per_token == heads_sides * 64 * 4
    assert quantized_layout(8).bytes_per_token == heads_sides * (64 + 2 * 2 * 4)
    assert quantized_layout(4).bytes_per_token == heads_sides * (32 + 2 * 2 * 4)


# ---------------------------------------------------------------- where it applies
def test_the_format_goes_to_full_attention_caches_only(model):
    plain = build_kv_cache(model, weight_bytes=0, pool_tokens=256).layout
    layout = build_kv_cache(model, weight_bytes=0, pool_tokens=256, kv_format=Q8).layout
    assert all(s.bits == 8 and s.group_size == 32 for s in layout.paged)
    assert all(s.bits is None for s in layout.snapshotted)
    assert layout.bytes_per_token < plain.bytes_per_token
    kinds = formats_by_kind(layout)
    assert kinds["full"] == "8-bit (group 32)"
    if layout.sliding:
        assert kinds["sliding"].startswith("float32 (") and "sliding-window" in kinds["sliding"]
    if layout.auxiliary:
        assert kinds["auxiliary"].startswith("own state")
    caches = fresh_caches(model, layout)
    for spec in layout.caches:
        cache = cache_at(caches, spec.path)
        assert isinstance(cache, QuantizedKVCache) == (spec.kind == FULL)
    assert formats_by_kind(plain)["full"] == "float32"


def test_a_group_size_the_head_dim_does_not_divide_keeps_full_precision(model):
    layout = build_kv_cache(
        model, weight_bytes=0, pool_tokens=256, kv_format=KVFormat(8, 128)
    ).layout
    assert all(not s.quantized for s in layout.paged)
    assert "KV group size 128" in formats_by_kind(layout)["full"]
    assert "KV at full precision" in layout.describe()
    assert all(type(cache_at(fresh_caches(model, layout), s.path)) is KVCache for s in layout.paged)


def test_bad_formats_are_one_line_errors():
    with pytest.raises(ValueError, match="KV bits must be one of 4, 8, not 3"):
        KVFormat(3)
    with pytest.raises(ValueError, match="KV group size must be one of 32, 64, 128, not 48"):
        KVFormat(8, 48)


def test_the_store_fingerprint_names_the_format(model):
    layouts = {
        fmt: build_kv_cache(model, weight_bytes=0, pool_tokens=256, kv_format=fmt).layout
        for fmt in (FULL_PRECISION, Q8, Q4)
    }
    prints = {fmt: store_fingerprint(FP, layout) for fmt, layout in layouts.items()}
    assert prints[FULL_PRECISION] == FP  # a store from before the KV format reads as it did
    assert len({prints[FULL_PRECISION], prints[Q8], prints[Q4]}) == 3


# ---------------------------------------------------------------- bytes and the disk
def test_quantized_kv_serializes_as_it_is():
    layout = quantized_layout(4)
    layers = [
        tuple(
            mx.quantize(mx.random.normal((2, 5, 64), key=mx.random.key(i + s)), 32, 4)
            for s in (0, 10)
        )  # fmt: skip
        for i in range(2)
    ]
    back = kv_from_bytes(kv_to_bytes(layers), 2, 5, layout)
    for (k, v), (k2, v2) in zip(layers, back):
        assert_same(k, k2)
        assert_same(v, v2)


@pytest.mark.parametrize("kv_format", [Q8, Q4], ids=["8-bit", "4-bit"])
def test_quantized_pages_round_trip_through_the_disk_tier_bit_exact(model, kv_format, tmp_path):
    """Saved from a request's caches, restored by a new tier over a new pool: the restored
    caches hold the very bytes that were saved, and the tree's pages too."""
    tokens = [(7 * i + 3) % 250 + 1 for i in range(150)]
    db = tmp_path / "kvcache.db"
    pc = prefix_cache(model, kv_format)
    original, snaps = computed(model, pc, tokens)
    writer = DiskTier(db, pc, FP)
    assert writer.fingerprint == f"{FP}+{kv_format.tag}" and writer.model_fingerprint == FP
    writer.save("chat", tokens, original, snaps)
    writer.flush(timeout=30)
    writer.close()
    fresh = prefix_cache(model, kv_format)
    reader = DiskTier(db, fresh, FP)
    try:
        prompt = tokens + [1, 2]
        assert reader.restore(prompt, "chat") == 150
        prefix = fresh.match(prompt)
        assert prefix.length == 150
        caches = fresh.make_caches(prefix)
        for spec in fresh.layout.paged:
            got, want = cache_at(caches, spec.path), cache_at(original, spec.path)
            assert isinstance(got, QuantizedKVCache) and got.bits == kv_format.bits
            for side in ("keys", "values"):
                assert_same(
                    tuple(x[..., :150, :] for x in getattr(got, side)),
                    tuple(x[..., :150, :] for x in getattr(want, side)),
                )
        fresh.release(prefix)
        # out of the pool (after the restore's deferred copy) the same bytes again
        for i, spec in enumerate(fresh.layout.paged):
            keys, _ = fresh.cached_kv(tokens)[i]
            assert_same(keys, tuple(x[0, :, :150] for x in cache_at(original, spec.path).keys))
    finally:
        reader.close()


def test_a_store_of_one_format_is_a_miss_in_another(model, tmp_path):
    """Pages written at 8 bits are never read at full precision or at 4 bits: the store's
    fingerprint differs, so the other format finds nothing (a clean miss)."""
    tokens = [(5 * i + 1) % 250 + 1 for i in range(150)]
    db = tmp_path / "kvcache.db"
    pc = prefix_cache(model, Q8)
    caches, snaps = computed(model, pc, tokens)
    writer = DiskTier(db, pc, FP)
    writer.save("chat", tokens, caches, snaps)
    writer.flush(timeout=30)
    writer.close()
    for other in (FULL_PRECISION, Q4, Q8):
        fresh = prefix_cache(model, other)
        reader = DiskTier(db, fresh, FP)
        try:
            restored = reader.restore(tokens + [1], "chat")
            assert restored == (150 if other == Q8 else 0)
            assert fresh.cached_length(tokens) == restored
        finally:
            reader.close()
