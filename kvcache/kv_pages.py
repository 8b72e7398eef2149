"""Quantized K/V in the pool, in a request's caches and on disk (``kvcache.kv_format``
says what the format is and where it applies).

A side (keys or values) of a paged cache is one ``(heads, n, dim)`` array at full
precision and the three arrays of ``mx.quantize`` (packed words, scales, biases) when
quantized; the helpers here take either, so the pool, the tree's sources and the disk
tier move quantized pages as they are, never dequantized.
"""

from __future__ import annotations

import dataclasses
import logging

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

from kvcache.kv_format import KVFormat
from kvcache.layout import (
    AUXILIARY,
    FULL,
    PROBE_TOKENS,
    SLIDING,
    CacheLayout,
    CacheSpec,
    put_cache,
)

log = logging.getLogger(__name__)


def apply_format(model, layout: CacheLayout, kv_format: KVFormat) -> CacheLayout:
    """``layout`` with its full-attention caches stored in ``kv_format`` where that works
    (see the module doc); the same layout at full precision."""
    if not kv_format.quantized or not layout.paged:
        return layout
    caches = []
    for spec in layout.caches:
        if spec.kind == FULL and _divides(kv_format.group_size, spec):
            spec = dataclasses.replace(spec, bits=kv_format.bits, group_size=kv_format.group_size)
        elif spec.kind == FULL:
            spec = dataclasses.replace(
                spec, note=f"head dim not a multiple of KV group size {kv_format.group_size}"
            )
        caches.append(spec)
    quantized = CacheLayout(tuple(caches), layout.slots)
    try:
        model(
            mx.array([list(range(PROBE_TOKENS))], dtype=mx.int32),
            cache=fresh_caches(model, quantized),
        )
    except Exception as e:  # noqa: BLE001  (the model's attention takes no quantized cache)
        note = f"quantized KV unsupported by the model's attention ({type(e).__name__})"
        log.warning("KV kept at full precision: %s: %s", note, e)
        return CacheLayout(
            tuple(
                dataclasses.replace(s, note=note) if s.kind == FULL else s for s in layout.caches
            ),
            layout.slots,
        )
    return quantized


def _divides(group: int, spec: CacheSpec) -> bool:
    return spec.key_dim % group == 0 and spec.value_dim % group == 0


def new_cache(spec: CacheSpec):
    """An empty mlx-lm cache object for a paged cache, in its stored format."""
    if spec.quantized:
        return QuantizedKVCache(group_size=spec.group_size, bits=spec.bits)
    return KVCache()


def fresh_caches(model, layout: CacheLayout | None) -> list:
    """A request's empty caches: mlx-lm's own, the paged ones in their stored format."""
    caches = make_prompt_cache(model)
    if layout is not None:
        for spec in layout.paged:
            if spec.quantized:
                put_cache(caches, spec.path, new_cache(spec))
    return caches


def cache_holding(spec: CacheSpec, keys, values, offset: int):
    """A cache object of ``spec``'s format holding ``keys``/``values`` (``(1, heads, m,
    width)`` arrays, a tuple of three when quantized; ``m >= offset``) as its first
    ``offset`` tokens; the rest is room the next tokens are written into in place."""
    cache = new_cache(spec)
    cache.keys, cache.values, cache.offset = keys, values, offset
    return cache


def is_paged_cache(cache) -> bool:
    """Whether ``cache`` is one of the cache classes built from pages (trimmable in place)."""
    return type(cache) in (KVCache, QuantizedKVCache)


# --------------------------------------------------------------- K/V of either format
def parts(kv) -> tuple[mx.array, ...]:
    """One side's arrays: ``(kv,)`` at full precision, the quantized triple as is."""
    return tuple(kv) if isinstance(kv, (tuple, list)) else (kv,)


def joined(arrays, spec_side_count: int):
    """The inverse of :func:`parts`: a single array, or a tuple of the quantized three."""
    arrays = tuple(arrays)
    return arrays[0] if spec_side_count == 1 else arrays


def tokens_of(kv, a: int, b: int, batch: bool = False):
    """Tokens ``a..b-1`` of one side: ``(heads, n, width)`` arrays; ``batch``: of a cache's
    ``(1, heads, m, width)`` arrays, the batch axis dropped."""
    if batch:
        return _map(lambda x: x[0, :, a:b], kv)
    return _map(lambda x: x[:, a:b], kv)


def with_batch(kv):
    """``(heads, n, width)`` -> ``(1, heads, n, width)``, for either format."""
    return _map(lambda x: x[None], kv)


def without_batch(kv):
    return _map(lambda x: x[0], kv)


def flatten(layers_kv) -> list[mx.array]:
    """Every array of ``[(keys, values), ...]``, in order: K parts then V parts per layer."""
    return [a for keys, values in layers_kv for a in parts(keys) + parts(values)]


def regroup(arrays: list, layout: CacheLayout) -> list[tuple]:
    """The inverse of :func:`flatten` for ``layout``'s paged caches."""
    out, at = [], 0
    for spec in layout.paged:
        key_parts, value_parts = spec.kv_parts()
        keys = joined(arrays[at : at + len(key_parts)], len(key_parts))
        at += len(key_parts)
        values = joined(arrays[at : at + len(value_parts)], len(value_parts))
        at += len(value_parts)
        out.append((keys, values))
    return out


def arrays_per_token(layout: CacheLayout) -> int:
    """How many arrays :func:`flatten` gives for ``layout``'s paged caches."""
    return sum(len(k) + len(v) for k, v in (s.kv_parts() for s in layout.paged))


def _map(fn, kv):
    return tuple(fn(x) for x in kv) if isinstance(kv, (tuple, list)) else fn(kv)


# --------------------------------------------------------------- what each kind keeps
WHY_NOT = {
    SLIDING: "mlx-lm has no quantized sliding-window cache",
    AUXILIARY: "recurrent / linear-attention state, not K/V",
}


def formats_by_kind(layout: CacheLayout | None) -> dict[str, str]:
    """The KV format per layer kind present in ``layout``, for the cache panel and
    ``/v1/models``: ``{"full": "8-bit (group 64)", "sliding": "float32 (mlx-lm has no
    quantized sliding-window cache)", ...}``."""
    if layout is None:
        return {}
    out: dict[str, str] = {}
    for kind in (FULL, SLIDING, AUXILIARY):
        specs = [s for s in layout.caches if s.kind == kind]
        if not specs:
            continue
        text = ", ".join(sorted({s.format_name for s in specs}))
        if kind == FULL:
            notes = sorted({s.note for s in specs if s.note and not s.quantized})
            if notes:
                text += f" ({'; '.join(notes)})"
        elif kind == SLIDING:
            if any(s.quantized for s in layout.paged):
                text += f" ({WHY_NOT[SLIDING]})"
        else:
            text = f"own state ({WHY_NOT[AUXILIARY]})"
        out[kind] = text
    return out


def store_fingerprint(model_fingerprint: str, layout: CacheLayout | None) -> str:
    """The fingerprint the disk store keys pages by: the model's, plus the KV format when
    pages are quantized, so pages of one format are never read as another's (a store
    written at 8 bits is a clean miss at full precision or 4 bits)."""
    quantized = [s for s in layout.paged if s.quantized] if layout is not None else []
    if not quantized:
        return model_fingerprint
    tag = KVFormat(quantized[0].bits, quantized[0].group_size).tag
    return f"{model_fingerprint}+{tag}"
