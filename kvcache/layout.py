"""The cache layout of a loaded mlx-lm model: which layers the page pool holds.

Every layer of a model falls in one of three classes, read from the cache object
mlx-lm makes for it (``model.make_cache()``, else one ``KVCache`` per layer, as
``mlx_lm.models.cache.make_prompt_cache`` does):

- ``"full"``: ``KVCache``, full attention; its K/V are paged in the pool;
- ``"sliding"``: ``RotatingKVCache``, sliding-window attention (``max_size`` is the window);
- ``"auxiliary"``: ``ArraysCache`` (Mamba, gated delta, ...) or any other cache object;
  its state is snapshotted whole, never paged.

``QuantizedKVCache``, ``ChunkedKVCache``, ``ConcatenateKVCache``, ``CacheList`` and the
batch caches are refused with a ``ValueError``: a quantized or chunked cache cannot be
paged as plain K/V, and a ``CacheList`` mixes paged and snapshotted state in one layer.

KV heads, head dim and dtype come from one dummy token run through the model with fresh
caches: each attention cache then holds keys of shape ``(1, kv_heads, T, head_dim)`` in
the dtype the model really computes in. That works for every architecture (attribute
names differ, quantized weights hide the projection shapes, activations may not share the
weights' dtype) and costs only graph construction: shapes and dtypes are known without
evaluating anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import mlx.core as mx
from mlx_lm.models.cache import (
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    ChunkedKVCache,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)

FULL, SLIDING, AUXILIARY = "full", "sliding", "auxiliary"

# Where mlx-lm models keep their decoder layers, tried in this order.
LAYER_PATHS = (
    ("layers",),
    ("model", "layers"),
    ("language_model", "model", "layers"),
    ("language_model", "layers"),
    ("backbone", "layers"),
    ("transformer", "h"),
    ("transformer", "layers"),
    ("model", "decoder", "layers"),
)

# Attribute names of the attention module inside a decoder layer, tried in this order.
ATTENTION_ATTRS = ("self_attn", "attention", "attn", "self_attention", "mixer")

UNSUPPORTED_CACHES = (
    QuantizedKVCache,
    ChunkedKVCache,
    ConcatenateKVCache,
    CacheList,
    BatchKVCache,
    BatchRotatingKVCache,
)


@dataclass(frozen=True)
class LayerSpec:
    """One layer. ``window``/``keep``: sliding layers only; ``kv_heads``, ``head_dim``,
    ``dtype`` (an mlx dtype name such as "float32") and ``attention_attr``: attention
    layers only (``attention_attr`` is None when no known attribute name matched)."""

    index: int
    kind: str  # FULL | SLIDING | AUXILIARY
    window: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str | None = None
    attention_attr: str | None = None
    keep: int = 0  # RotatingKVCache.keep: leading tokens a sliding layer never drops

    @property
    def bytes_per_token(self) -> int:
        """K + V bytes of one token in this layer (0 for auxiliary layers)."""
        if self.kind == AUXILIARY:
            return 0
        return 2 * self.kv_heads * self.head_dim * dtype_from_name(self.dtype).size


@dataclass(frozen=True)
class CacheLayout:
    """The classified layers of a model; ``layers[i].index == i``."""

    layers: tuple[LayerSpec, ...]

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("a cache layout needs at least one layer")
        for i, spec in enumerate(self.layers):
            if spec.index != i or spec.kind not in (FULL, SLIDING, AUXILIARY):
                raise ValueError(f"bad layer spec at position {i}: {spec}")

    def _indices(self, *kinds: str) -> tuple[int, ...]:
        return tuple(s.index for s in self.layers if s.kind in kinds)

    @cached_property
    def full_layer_indices(self) -> tuple[int, ...]:
        return self._indices(FULL)

    @cached_property
    def sliding_layer_indices(self) -> tuple[int, ...]:
        return self._indices(SLIDING)

    @cached_property
    def auxiliary_layer_indices(self) -> tuple[int, ...]:
        return self._indices(AUXILIARY)

    @cached_property
    def attention_layer_indices(self) -> tuple[int, ...]:
        return self._indices(FULL, SLIDING)

    @cached_property
    def _pool_index(self) -> dict[int, int]:
        return {layer: i for i, layer in enumerate(self.full_layer_indices)}

    def attention_pool_index(self, layer: int) -> int:
        """Dense index of full-attention ``layer`` among the layers paged in the pool."""
        try:
            return self._pool_index[layer]
        except KeyError:
            kind = self.layers[layer].kind if 0 <= layer < len(self.layers) else "no such layer"
            raise KeyError(
                f"layer {layer} is not paged in the pool ({kind}); "
                f"full-attention layers: {list(self.full_layer_indices)}"
            ) from None

    @property
    def full_layers(self) -> tuple[LayerSpec, ...]:
        """The specs of the paged layers, in pool-index order."""
        return tuple(self.layers[i] for i in self.full_layer_indices)

    @property
    def sliding_window(self) -> int | None:
        """The sliding window (the largest, should layers differ); None without sliding layers."""
        windows = [self.layers[i].window for i in self.sliding_layer_indices]
        return max(windows) if windows else None

    @property
    def is_hybrid_swa(self) -> bool:
        """Has sliding-window layers, whose state the tree must snapshot at node ends."""
        return bool(self.sliding_layer_indices)

    @property
    def is_hybrid_ssm(self) -> bool:
        """Has auxiliary (recurrent / linear-attention) layers, snapshotted whole."""
        return bool(self.auxiliary_layer_indices)

    @property
    def bytes_per_token(self) -> int:
        """K + V bytes of one token over all full-attention (pooled) layers."""
        return sum(s.bytes_per_token for s in self.full_layers)

    def describe(self) -> str:
        """One line, e.g. '4 layers: 2 full, 2 sliding (window 16), 0 auxiliary; ...'."""
        parts = [f"{len(self.full_layer_indices)} full"]
        sliding = f"{len(self.sliding_layer_indices)} sliding"
        if self.sliding_window is not None:
            sliding += f" (window {self.sliding_window})"
        parts += [sliding, f"{len(self.auxiliary_layer_indices)} auxiliary"]
        shapes = sorted(
            {(s.kv_heads, s.head_dim, s.dtype) for s in self.layers if s.kind != AUXILIARY}
        )
        kv = ", ".join(f"{h}x{d} {t}" for h, d, t in shapes) or "none"
        return (
            f"{len(self.layers)} layers: {', '.join(parts)}; KV heads x head dim: {kv}; "
            f"{self.bytes_per_token:,} pooled bytes/token"
        )


def cache_layout(model) -> CacheLayout:
    """Classify every layer of the loaded mlx-lm ``model``; ``ValueError`` if it can't."""
    layers = find_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no layers")
    caches = model.make_cache() if hasattr(model, "make_cache") else [KVCache() for _ in layers]
    if len(caches) != len(layers):
        raise ValueError(
            f"{type(model).__name__}.make_cache() returned {len(caches)} caches "
            f"for {len(layers)} layers"
        )
    kinds = [classify_cache(c, i) for i, c in enumerate(caches)]
    if any(k != AUXILIARY for k in kinds):
        _run_one_token(model, caches)
    specs = []
    for i, (layer, cache, kind) in enumerate(zip(layers, caches, kinds)):
        if kind == AUXILIARY:
            specs.append(LayerSpec(i, kind))
            continue
        kv_heads, head_dim, dtype = _kv_shape(cache, i)
        specs.append(
            LayerSpec(
                index=i,
                kind=kind,
                window=cache.max_size if kind == SLIDING else None,
                kv_heads=kv_heads,
                head_dim=head_dim,
                dtype=dtype,
                attention_attr=_attention_attr(layer),
                keep=cache.keep if kind == SLIDING else 0,
            )
        )
    return CacheLayout(tuple(specs))


def find_layers(model) -> list:
    """The model's decoder layers, found along the first of ``LAYER_PATHS`` that exists."""
    for path in LAYER_PATHS:
        node = model
        for name in path:
            node = getattr(node, name, None)
            if node is None:
                break
        if isinstance(node, (list, tuple)):
            return list(node)
    tried = ", ".join("model." + ".".join(p) for p in LAYER_PATHS)
    raise ValueError(f"cannot find the layer list of {type(model).__name__} (tried {tried})")


def classify_cache(cache, index: int) -> str:
    """FULL, SLIDING or AUXILIARY for one layer's cache object; ValueError if unsupported."""
    if isinstance(cache, UNSUPPORTED_CACHES):
        raise ValueError(f"layer {index}: unsupported cache type {type(cache).__name__}")
    if isinstance(cache, RotatingKVCache):
        return SLIDING
    if isinstance(cache, KVCache):
        return FULL
    return AUXILIARY  # ArraysCache and anything else: state snapshotted whole


def dtype_from_name(name: str) -> mx.Dtype:
    """``"float32"`` -> ``mx.float32``."""
    dtype = getattr(mx, name, None)
    if not isinstance(dtype, mx.Dtype):
        raise ValueError(f"not an mlx dtype: {name!r}")
    return dtype


def dtype_name(dtype: mx.Dtype) -> str:
    """``mx.float32`` -> ``"float32"``."""
    return str(dtype).rsplit(".", 1)[-1]


def _run_one_token(model, caches: list) -> None:
    """Fill fresh ``caches`` with one token (lazily: shapes need no evaluation)."""
    try:
        model(mx.array([[0]], dtype=mx.int32), cache=caches)
    except Exception as e:  # noqa: BLE001  (any model failure becomes one clear error)
        raise ValueError(
            f"cannot read the KV shapes of {type(model).__name__}: "
            f"a one-token forward failed ({type(e).__name__}: {e})"
        ) from e


def _kv_shape(cache, index: int) -> tuple[int, int, str]:
    keys, values = cache.keys, cache.values
    if keys is None or values is None or keys.ndim != 4:
        raise ValueError(f"layer {index}: its cache holds no keys after a one-token forward")
    if values.shape[-1] != keys.shape[-1] or values.dtype != keys.dtype:
        raise ValueError(
            f"layer {index}: keys {keys.shape} {keys.dtype} and values {values.shape} "
            f"{values.dtype} differ in head dim or dtype (unsupported)"
        )
    return keys.shape[1], keys.shape[3], dtype_name(keys.dtype)


def _attention_attr(layer) -> str | None:
    for name in ATTENTION_ATTRS:
        if getattr(layer, name, None) is not None:
            return name
    return None
