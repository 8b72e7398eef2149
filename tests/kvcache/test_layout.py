"""kvcache.layout: classifying the caches of tiny generated models and of fakes."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)
from mlx_lm.utils import load

from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.layout import (
    AUXILIARY,
    BOTH,
    FULL,
    PAGES,
    SLIDING,
    SNAPSHOTS,
    CacheLayout,
    CacheSpec,
    cache_at,
    cache_layout,
    put_cache,
)

KV_HEADS, HEAD_DIM = 2, 16  # TinyModelSpec defaults: 2 KV heads, 64 / 4 = 16 head dim


@pytest.fixture(scope="module")
def load_tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout-models")

    def _load(kind: str, num_layers: int, dtype: str = "float32"):
        spec = TinyModelSpec(kind=kind, num_layers=num_layers, dtype=dtype)
        model, _ = load(str(write_tiny_model(root / f"{kind}-{num_layers}-{dtype}", spec)))
        return model

    return _load


def float32_bytes_per_token(full_layers: int) -> int:
    return 2 * full_layers * KV_HEADS * HEAD_DIM * 4


def test_llama_every_cache_is_full(load_tiny):
    layout = cache_layout(load_tiny("llama", 2))
    assert [s.kind for s in layout.caches] == [FULL, FULL]
    assert [s.path for s in layout.paged] == [(0, None), (1, None)] and layout.slots == 2
    assert layout.sliding == layout.auxiliary == layout.snapshotted == ()
    assert [layout.pool_index(i) for i in (0, 1)] == [0, 1]
    assert layout.sliding_window is None and layout.cached_as == PAGES
    assert not layout.is_hybrid_swa and not layout.is_hybrid_ssm
    assert layout.bytes_per_token == float32_bytes_per_token(2)
    for spec in layout.caches:
        assert (
            spec.key_shape == spec.value_shape == (KV_HEADS, HEAD_DIM) and spec.dtype == "float32"
        )
        assert spec.window is None and spec.cache_type == "KVCache" and spec.note == ""
    with pytest.raises(KeyError, match="cache 7 is not paged"):
        layout.pool_index(7)


def test_sliding_caches_alternate_with_full_ones(load_tiny):
    layout = cache_layout(load_tiny("sliding", 4))
    assert [s.kind for s in layout.caches] == [SLIDING, FULL, SLIDING, FULL]
    assert [s.slot for s in layout.paged] == [1, 3] and [s.slot for s in layout.sliding] == [0, 2]
    assert layout.pool_index(1) == 0 and layout.pool_index(3) == 1
    assert layout.sliding_window == 16 and layout.caches[0].window == 16
    assert layout.is_hybrid_swa and not layout.is_hybrid_ssm and layout.cached_as == BOTH
    assert layout.bytes_per_token == float32_bytes_per_token(2)  # sliding caches not pooled
    assert layout.caches[0].key_heads == KV_HEADS and layout.caches[0].dtype == "float32"
    with pytest.raises(KeyError, match=r"cache 2 is not paged in the pool \(sliding\)"):
        layout.pool_index(2)


def test_recurrent_caches_are_auxiliary(load_tiny):
    layout = cache_layout(load_tiny("recurrent", 4))
    assert [s.kind for s in layout.caches] == [AUXILIARY, FULL, AUXILIARY, FULL]
    assert [s.slot for s in layout.paged] == [1, 3] and [s.slot for s in layout.auxiliary] == [0, 2]
    assert layout.pool_index(3) == 1
    assert layout.is_hybrid_ssm and not layout.is_hybrid_swa
    assert layout.bytes_per_token == float32_bytes_per_token(2)
    assert layout.caches[0] == CacheSpec(0, AUXILIARY, slot=0, cache_type="ArraysCache")
    with pytest.raises(KeyError, match="auxiliary"):
        layout.pool_index(0)


def test_dtype_comes_from_the_computed_keys(load_tiny):
    layout = cache_layout(load_tiny("llama", 2, dtype="float16"))
    assert {s.dtype for s in layout.caches} == {"float16"}
    assert layout.bytes_per_token == 2 * 2 * KV_HEADS * HEAD_DIM * 2


def test_describe_is_one_line(load_tiny):
    text = cache_layout(load_tiny("sliding", 4)).describe()
    assert "\n" not in text
    assert "4 caches in 4 slots: 2 full, 2 sliding (window 16), 0 auxiliary" in text
    assert (
        "2x16 float32" in text
        and "512 pooled bytes/token" in text
        and "cached as pages+snapshots" in text
    )


class FakeModel:
    """A layer list, a make_cache and a forward that writes into the caches as ``write``
    says (``write(caches, tokens)``), the way a model's attention would."""

    def __init__(self, num_layers: int, make_cache, write=None):
        self.layers = [object() for _ in range(num_layers)]
        self._make_cache = make_cache
        self._write = write

    def make_cache(self):
        return self._make_cache()

    def __call__(self, inputs, cache=None):
        if self._write is None:
            raise RuntimeError("fake forward")
        self._write(cache, inputs.shape[1])
        return mx.zeros((1, inputs.shape[1], 8))


def kv(
    cache, n: int, heads: int = 2, key_dim: int = 8, value_dim: int = 8, dtype=mx.float32
) -> None:
    """``n`` tokens of K/V into ``cache`` (one row per token)."""
    cache.update_and_fetch(
        mx.zeros((1, heads, n, key_dim), dtype), mx.zeros((1, heads, n, value_dim), dtype)
    )


def test_caches_not_layers_are_counted():
    # 4 layers, 2 of which share the others' K/V (Gemma 4) or hold none (Nemotron-H's MLP)
    model = FakeModel(
        4, lambda: [KVCache(), KVCache()], lambda caches, n: [kv(c, n) for c in caches]
    )
    layout = cache_layout(model)
    assert [s.path for s in layout.paged] == [(0, None), (1, None)] and layout.slots == 2
    # more caches than layers (a loop model runs its layers twice over other caches)
    model = FakeModel(
        1, lambda: [KVCache(), RotatingKVCache(8)], lambda caches, n: [kv(c, n) for c in caches]
    )
    layout = cache_layout(model)
    assert [s.kind for s in layout.caches] == [FULL, SLIDING] and layout.sliding_window == 8


def test_a_none_slot_holds_nothing():
    model = FakeModel(
        3,
        lambda: [KVCache(), None, KVCache()],
        lambda caches, n: [kv(caches[i], n) for i in (0, 2)],
    )
    layout = cache_layout(model)
    assert [s.path for s in layout.caches] == [(0, None), (2, None)] and layout.slots == 3
    assert layout.describe().startswith("2 caches in 3 slots")


def test_mla_keys_and_values_keep_their_own_widths():
    """A compressed latent (512 wide) as keys and its rope part (64 wide) as values, one
    head each (DeepSeek-V3's shapes, scaled): paged as they are."""
    model = FakeModel(
        2,
        lambda: [KVCache(), KVCache()],
        lambda caches, n: [kv(c, n, heads=1, key_dim=32, value_dim=4) for c in caches],
    )
    layout = cache_layout(model)
    assert layout.cached_as == PAGES
    spec = layout.paged[0]
    assert spec.key_shape == (1, 32) and spec.value_shape == (1, 4)
    assert spec.bytes_per_token == (32 + 4) * 4 and layout.bytes_per_token == 2 * 36 * 4
    assert "K 1x32 / V 1x4 float32" in layout.describe()


def test_a_cache_list_is_taken_apart_into_its_members():
    def make():
        return [CacheList(ArraysCache(2), KVCache()), KVCache()]

    def write(caches, n):
        caches[0][0][0] = mx.zeros((1, 3, 4))
        kv(caches[0][1], n)
        kv(caches[1], n)

    layout = cache_layout(FakeModel(2, make, write))
    assert [(s.path, s.kind) for s in layout.caches] == [
        ((0, 0), AUXILIARY),
        ((0, 1), FULL),
        ((1, None), FULL),
    ]
    assert layout.pool_index(0, 1) == 0 and layout.pool_index(1) == 1 and layout.cached_as == BOTH
    caches = make()
    assert (
        isinstance(cache_at(caches, (0, 0)), ArraysCache)
        and cache_at(caches, (1, None)) is caches[1]
    )
    fresh = KVCache()
    put_cache(caches, (0, 1), fresh)
    assert caches[0].caches[1] is fresh and isinstance(caches[0].caches[0], ArraysCache)


@pytest.mark.parametrize(
    "make, write, note",
    [
        (
            lambda: [QuantizedKVCache(group_size=32, bits=8)],
            lambda c, n: kv(c[0], n, key_dim=32, value_dim=32),
            "QuantizedKVCache: not plain K/V",
        ),
        (lambda: [ChunkedKVCache(4)], lambda c, n: kv(c[0], n), "ChunkedKVCache: not plain K/V"),
        (
            lambda: [KVCache()],
            lambda c, n: None,
            "KVCache holding no plain K/V after a trial forward",
        ),
        (lambda: [KVCache()], lambda c, n: kv(c[0], n // 2), "KVCache not one row per token"),
        (
            lambda: [KVCache()],
            lambda c, n: (
                kv(c[0], n, dtype=mx.float16)
                or setattr(c[0], "values", c[0].values.astype(mx.float32))
            ),
            "KVCache holding no plain K/V after a trial forward",
        ),
    ],
)
def test_what_pages_cannot_hold_is_snapshotted(make, write, note):
    layout = cache_layout(FakeModel(1, make, write))
    [spec] = layout.caches
    assert spec.kind == AUXILIARY and spec.note == note
    assert layout.cached_as == SNAPSHOTS and layout.is_hybrid_ssm and note in layout.describe()


def test_pure_recurrent_model_is_cached_by_snapshots():
    layout = cache_layout(
        FakeModel(3, lambda: [ArraysCache(size=2) for _ in range(3)], lambda c, n: None)
    )
    assert [s.slot for s in layout.auxiliary] == [0, 1, 2] and layout.paged == ()
    assert layout.bytes_per_token == 0 and layout.sliding_window is None
    assert layout.is_hybrid_ssm and layout.cached_as == SNAPSHOTS
    assert "0 pooled bytes/token" in layout.describe() and "(snapshotted" not in layout.describe()


def test_no_caches_is_an_error():
    with pytest.raises(ValueError, match="makes no caches"):
        cache_layout(FakeModel(0, list))
    with pytest.raises(ValueError, match="makes no caches"):
        cache_layout(FakeModel(1, lambda: [None]))
    with pytest.raises(ValueError, match="cannot make its caches"):
        cache_layout(object())
    with pytest.raises(ValueError, match="at least one cache"):
        CacheLayout(())


def test_failed_forward_is_a_clear_error():
    with pytest.raises(ValueError, match="3-token forward failed.*fake forward"):
        cache_layout(FakeModel(1, lambda: [KVCache()]))


def test_model_without_make_cache_gets_one_kvcache_per_layer(load_tiny):
    inner = load_tiny("llama", 2)

    class Wrapper:  # no make_cache: mlx-lm makes one KVCache per model.layers
        layers = inner.layers

        def __call__(self, inputs, cache=None):
            return inner(inputs, cache=cache)

    assert cache_layout(Wrapper()) == cache_layout(inner)


def test_a_deepseek_v3_shaped_model_pages_its_latent_not_per_head_kv():
    """DeepSeek-V3's real shapes (61 layers, 128 heads; built lazily: no weight is ever
    made, the trial forward is never evaluated): each layer caches a 512-wide latent and
    a 64-wide rope part per token, 70,272 bytes a token in bfloat16, where per-head K and
    V (128 heads x (192 + 128)) would take 4,997,120: 71 times as much."""
    from mlx_lm.models import deepseek_v3

    args = deepseek_v3.ModelArgs.from_dict(
        dict(
            model_type="deepseek_v3",
            vocab_size=129280,
            hidden_size=7168,
            intermediate_size=18432,
            moe_intermediate_size=2048,
            num_hidden_layers=61,
            num_attention_heads=128,
            num_key_value_heads=128,
            n_shared_experts=1,
            n_routed_experts=256,
            routed_scaling_factor=2.5,
            kv_lora_rank=512,
            q_lora_rank=1536,
            qk_rope_head_dim=64,
            v_head_dim=128,
            qk_nope_head_dim=128,
            n_group=8,
            topk_group=4,
            num_experts_per_tok=8,
            first_k_dense_replace=3,
            max_position_embeddings=163840,
        )
    )
    model = deepseek_v3.Model(args)
    model.set_dtype(mx.bfloat16)
    before = mx.get_peak_memory()
    layout = cache_layout(model)
    assert mx.get_peak_memory() == before  # shapes only
    assert len(layout.paged) == 61 and layout.cached_as == PAGES
    assert {(s.key_shape, s.value_shape, s.dtype) for s in layout.paged} == {
        ((1, 512), (1, 64), "bfloat16")
    }
    assert layout.bytes_per_token == 61 * (512 + 64) * 2 == 70_272
