"""kvcache.layout: classifying the layers of tiny generated models and of fakes."""

from __future__ import annotations

import pytest
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, QuantizedKVCache
from mlx_lm.utils import load

from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.layout import AUXILIARY, FULL, SLIDING, CacheLayout, LayerSpec, cache_layout

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


def test_llama_every_layer_is_full(load_tiny):
    layout = cache_layout(load_tiny("llama", 2))
    assert [s.kind for s in layout.layers] == [FULL, FULL]
    assert layout.full_layer_indices == layout.attention_layer_indices == (0, 1)
    assert layout.sliding_layer_indices == layout.auxiliary_layer_indices == ()
    assert [layout.attention_pool_index(i) for i in (0, 1)] == [0, 1]
    assert layout.sliding_window is None
    assert not layout.is_hybrid_swa and not layout.is_hybrid_ssm
    assert layout.bytes_per_token == float32_bytes_per_token(2)
    for spec in layout.layers:
        assert (spec.kv_heads, spec.head_dim, spec.dtype) == (KV_HEADS, HEAD_DIM, "float32")
        assert spec.attention_attr == "self_attn" and spec.window is None
    with pytest.raises(KeyError, match="layer 7 is not paged"):
        layout.attention_pool_index(7)


def test_sliding_layers_alternate_with_full_ones(load_tiny):
    layout = cache_layout(load_tiny("sliding", 4))
    assert [s.kind for s in layout.layers] == [SLIDING, FULL, SLIDING, FULL]
    assert layout.full_layer_indices == (1, 3)
    assert layout.sliding_layer_indices == (0, 2)
    assert layout.attention_layer_indices == (0, 1, 2, 3)
    assert layout.attention_pool_index(1) == 0 and layout.attention_pool_index(3) == 1
    assert layout.sliding_window == 16 and layout.layers[0].window == 16
    assert layout.is_hybrid_swa and not layout.is_hybrid_ssm
    assert layout.bytes_per_token == float32_bytes_per_token(2)  # sliding layers not pooled
    assert layout.layers[0].kv_heads == KV_HEADS and layout.layers[0].dtype == "float32"
    with pytest.raises(KeyError, match=r"layer 2 is not paged in the pool \(sliding\)"):
        layout.attention_pool_index(2)


def test_recurrent_layers_are_auxiliary(load_tiny):
    layout = cache_layout(load_tiny("recurrent", 4))
    assert [s.kind for s in layout.layers] == [AUXILIARY, FULL, AUXILIARY, FULL]
    assert layout.full_layer_indices == layout.attention_layer_indices == (1, 3)
    assert layout.auxiliary_layer_indices == (0, 2)
    assert layout.attention_pool_index(3) == 1
    assert layout.is_hybrid_ssm and not layout.is_hybrid_swa
    assert layout.bytes_per_token == float32_bytes_per_token(2)
    assert layout.layers[0] == LayerSpec(0, AUXILIARY)
    with pytest.raises(KeyError, match="auxiliary"):
        layout.attention_pool_index(0)


def test_dtype_comes_from_the_computed_keys(load_tiny):
    layout = cache_layout(load_tiny("llama", 2, dtype="float16"))
    assert {s.dtype for s in layout.layers} == {"float16"}
    assert layout.bytes_per_token == 2 * 2 * KV_HEADS * HEAD_DIM * 2


def test_describe_is_one_line(load_tiny):
    text = cache_layout(load_tiny("sliding", 4)).describe()
    assert "\n" not in text
    assert "4 layers: 2 full, 2 sliding (window 16), 0 auxiliary" in text
    assert "2x16 float32" in text and "512 pooled bytes/token" in text


class FakeModel:
    """A layer list and a make_cache; calling it fails (no forward should be needed)."""

    def __init__(self, num_layers: int, make_cache):
        self.layers = [object() for _ in range(num_layers)]
        self._make_cache = make_cache

    def make_cache(self):
        return self._make_cache()

    def __call__(self, *args, **kwargs):
        raise RuntimeError("fake forward")


def test_cache_count_mismatch_names_both_counts():
    model = FakeModel(3, lambda: [KVCache(), KVCache()])
    with pytest.raises(ValueError, match="2 caches for 3 layers"):
        cache_layout(model)


def test_no_layers_is_an_error():
    with pytest.raises(ValueError, match="no layers"):
        cache_layout(FakeModel(0, list))
    with pytest.raises(ValueError, match="cannot find the layer list"):
        cache_layout(object())
    with pytest.raises(ValueError, match="at least one layer"):
        CacheLayout(())


def test_pure_recurrent_model_is_valid_with_nothing_to_page():
    layout = cache_layout(FakeModel(3, lambda: [ArraysCache(size=2) for _ in range(3)]))
    assert layout.auxiliary_layer_indices == (0, 1, 2)
    assert layout.attention_layer_indices == layout.full_layer_indices == ()
    assert layout.bytes_per_token == 0 and layout.sliding_window is None
    assert layout.is_hybrid_ssm
    assert "0 pooled bytes/token" in layout.describe()


@pytest.mark.parametrize(
    "cache, name",
    [(QuantizedKVCache(), "QuantizedKVCache"), (CacheList(ArraysCache(2), KVCache()), "CacheList")],
)
def test_unsupported_cache_types_are_named(cache, name):
    with pytest.raises(ValueError, match=f"layer 0: unsupported cache type {name}"):
        cache_layout(FakeModel(1, lambda: [cache]))


def test_failed_forward_is_a_clear_error():
    with pytest.raises(ValueError, match="one-token forward failed.*fake forward"):
        cache_layout(FakeModel(1, lambda: [KVCache()]))


def test_model_without_make_cache_gets_one_kvcache_per_layer(load_tiny):
    inner = load_tiny("llama", 2)

    class Wrapper:  # layers nested at model.model.layers, no make_cache
        def __init__(self):
            self.model = inner.model

        def __call__(self, inputs, cache=None):
            return inner(inputs, cache=cache)

    layout = cache_layout(Wrapper())
    assert layout == cache_layout(inner)
