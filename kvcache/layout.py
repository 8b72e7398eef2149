"""The cache layout of a loaded mlx-lm model: which caches the page pool holds.

The layout is read from the cache list mlx-lm makes for the model
(``mlx_lm.models.cache.make_prompt_cache``: ``model.make_cache()``, else one ``KVCache``
per layer), not from the decoder layers: a model whose layers share another layer's K/V
(Gemma 4, Hunyuan's cross-layer attention), hold no cache (Nemotron-H's MLP layers) or
run twice over their caches (loop models) simply makes fewer or more caches than it has
layers, and the layout follows the caches. Each *slot* of that list is classified;
a ``CacheList`` slot (Falcon-H1, Baichuan-M1, DeepSeek-V3.2's indexer) is taken apart
and each of its members classified on its own. Every classified cache is one
:class:`CacheSpec`, of one of three kinds:

- ``"full"``: a ``KVCache`` (or ``ConcatenateKVCache``) that holds one K and one V row per
  token: paged in the pool. Keys and values keep their own shapes: an MLA model
  (DeepSeek-V2/V3, Kimi, GLM-4.x-lite...) caches a compressed latent as its "keys" and
  the rope part as its "values", of different widths, and both are paged as they are;
- ``"sliding"``: a ``RotatingKVCache`` (sliding-window attention, ``max_size`` is the
  window): snapshotted;
- ``"auxiliary"``: anything else, snapshotted whole at node ends: recurrent or
  linear-attention state (``ArraysCache``: Mamba, gated delta, RWKV...), and every cache
  that pages cannot rebuild (``ChunkedKVCache``, ``QuantizedKVCache``, a compressed cache
  that does not hold one row per token, a cache no layer wrote in a trial forward). What
  cannot be paged falls back to snapshots; nothing switches the cache off.

Shapes and dtypes come from a short trial forward (``PROBE_TOKENS`` tokens) through the
model with fresh caches: each paged cache then holds keys of shape ``(1, heads, T, dim)``
in the dtype the model really computes in. That works for every architecture (attribute
names differ, quantized weights hide the projection shapes, activations may not share
the weights' dtype) and costs only graph construction: shapes and dtypes are known
without evaluating anything. A cache is paged only if it took exactly one row per token.

A cache is addressed by its *path* in the cache list: ``(slot, None)`` for a slot,
``(slot, member)`` for a member of a ``CacheList`` slot (:func:`cache_at`,
:func:`put_cache`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import mlx.core as mx
from mlx_lm.models.cache import (
    CacheList,
    ConcatenateKVCache,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)

FULL, SLIDING, AUXILIARY = "full", "sliding", "auxiliary"
KINDS = (FULL, SLIDING, AUXILIARY)
PAGEABLE = (KVCache, ConcatenateKVCache)  # exactly these classes (not subclasses)
PROBE_TOKENS = 3  # the trial forward's length: a paged cache must take one row per token

# How a model is cached (CacheLayout.cached_as)
PAGES, SNAPSHOTS, BOTH = "pages", "snapshots", "pages+snapshots"

CachePath = tuple[int, "int | None"]  # (slot in the cache list, member of a CacheList or None)


@dataclass(frozen=True)
class CacheSpec:
    """One cache object of the model's cache list.

    ``index``: its position in :attr:`CacheLayout.caches`; ``slot``/``member``: where it
    is in the cache list (``member`` None unless the slot is a ``CacheList``).
    ``window``/``keep``: sliding caches only. Keys and values (full and sliding caches)
    have their own ``heads x dim``: ``key_heads``/``key_dim``, ``value_heads``/
    ``value_dim``; ``dtype`` is an mlx dtype name such as "float32". ``cache_type``: the
    class name of the cache object, ``note``: why a cache is snapshotted rather than
    paged, where that is not its nature (say, "QuantizedKVCache: quantized K/V")."""

    index: int
    kind: str  # FULL | SLIDING | AUXILIARY
    slot: int
    member: int | None = None
    cache_type: str = ""
    window: int | None = None
    keep: int = 0  # RotatingKVCache.keep: leading tokens a sliding layer never drops
    key_heads: int | None = None
    key_dim: int | None = None
    value_heads: int | None = None
    value_dim: int | None = None
    dtype: str | None = None
    note: str = ""
    bits: int | None = None  # full caches: K/V stored quantized at this width (kvcache.kv_format)
    group_size: int | None = None  # ... in groups of this many values (with ``bits``)

    @property
    def path(self) -> CachePath:
        return self.slot, self.member

    @property
    def key_shape(self) -> tuple[int, int]:
        return self.key_heads, self.key_dim

    @property
    def value_shape(self) -> tuple[int, int]:
        return self.value_heads, self.value_dim

    @property
    def quantized(self) -> bool:
        return self.bits is not None

    @property
    def format_name(self) -> str:
        """How this cache's K/V are stored: 'float32', or '8-bit (group 64)'."""
        if self.quantized:
            return f"{self.bits}-bit (group {self.group_size})"
        return self.dtype or "own state"

    def kv_parts(self) -> tuple[tuple[tuple[int, int, str], ...], tuple[tuple[int, int, str], ...]]:
        """The arrays one token's keys and values are stored as, each ``(heads, width,
        dtype name)``: one per side at full precision; quantized, the three of
        ``mx.quantize`` (packed ``uint32`` words, scales, biases)."""
        return (
            self._side(self.key_heads, self.key_dim),
            self._side(self.value_heads, self.value_dim),
        )

    def _side(self, heads: int, dim: int) -> tuple[tuple[int, int, str], ...]:
        if not self.quantized:
            return ((heads, dim, self.dtype),)
        groups = dim // self.group_size
        return ((heads, dim * self.bits // 32, "uint32"), *[(heads, groups, self.dtype)] * 2)

    @property
    def bytes_per_token(self) -> int:
        """K + V bytes of one token of this cache as stored (0 for auxiliary caches)."""
        if self.kind == AUXILIARY:
            return 0
        if not self.quantized:
            size = dtype_from_name(self.dtype).size
            return (self.key_heads * self.key_dim + self.value_heads * self.value_dim) * size
        return sum(
            heads * width * dtype_from_name(dtype).size
            for side in self.kv_parts()
            for heads, width, dtype in side
        )

    def describe_kv(self) -> str:
        """'2x16 float32', or 'K 1x512 / V 1x64 float32' when keys and values differ
        ('... float32 stored 8-bit (group 64)' when quantized)."""
        stored = f" stored {self.format_name}" if self.quantized else ""
        if self.key_shape == self.value_shape:
            return f"{self.key_heads}x{self.key_dim} {self.dtype}{stored}"
        keys, values = f"{self.key_heads}x{self.key_dim}", f"{self.value_heads}x{self.value_dim}"
        return f"K {keys} / V {values} {self.dtype}{stored}"


@dataclass(frozen=True)
class CacheLayout:
    """The classified caches of a model, in cache-list order; ``caches[i].index == i``.

    ``slots``: the length of the model's cache list (a slot may hold several caches: a
    ``CacheList``; a ``None`` slot holds none)."""

    caches: tuple[CacheSpec, ...]
    slots: int = 0

    def __post_init__(self) -> None:
        if not self.caches:
            raise ValueError("a cache layout needs at least one cache")
        paths = set()
        for i, spec in enumerate(self.caches):
            if spec.index != i or spec.kind not in KINDS or spec.path in paths:
                raise ValueError(f"bad cache spec at position {i}: {spec}")
            paths.add(spec.path)

    def _of(self, *kinds: str) -> tuple[CacheSpec, ...]:
        return tuple(s for s in self.caches if s.kind in kinds)

    @cached_property
    def paged(self) -> tuple[CacheSpec, ...]:
        """The full-attention caches, in pool order (pool index i is ``paged[i]``)."""
        return self._of(FULL)

    @cached_property
    def sliding(self) -> tuple[CacheSpec, ...]:
        return self._of(SLIDING)

    @cached_property
    def auxiliary(self) -> tuple[CacheSpec, ...]:
        return self._of(AUXILIARY)

    @cached_property
    def snapshotted(self) -> tuple[CacheSpec, ...]:
        """The caches whose state a snapshot holds: sliding, then auxiliary."""
        return self.sliding + self.auxiliary

    @cached_property
    def _pool_index(self) -> dict[CachePath, int]:
        return {spec.path: i for i, spec in enumerate(self.paged)}

    def pool_index(self, slot: int, member: int | None = None) -> int:
        """Dense index, among the caches paged in the pool, of the cache at ``(slot, member)``."""
        try:
            return self._pool_index[slot, member]
        except KeyError:
            spec = next((s for s in self.caches if s.path == (slot, member)), None)
            kind = spec.kind if spec is not None else "no such cache"
            raise KeyError(
                f"cache {_path_text((slot, member))} is not paged in the pool ({kind}); "
                f"paged caches: {[_path_text(s.path) for s in self.paged]}"
            ) from None

    @property
    def sliding_window(self) -> int | None:
        """The sliding window (the largest, should caches differ); None without sliding caches."""
        windows = [s.window for s in self.sliding]
        return max(windows) if windows else None

    @property
    def is_hybrid_swa(self) -> bool:
        """Has sliding-window caches, whose state the tree must snapshot at node ends."""
        return bool(self.sliding)

    @property
    def is_hybrid_ssm(self) -> bool:
        """Has auxiliary (recurrent / linear-attention / unpageable) caches, snapshotted whole."""
        return bool(self.auxiliary)

    @property
    def cached_as(self) -> str:
        """How a prefix is kept: ``"pages"`` (paged K/V only), ``"snapshots"`` (snapshots
        only: a model without a full-attention cache) or ``"pages+snapshots"``."""
        if not self.snapshotted:
            return PAGES
        return BOTH if self.paged else SNAPSHOTS

    @property
    def bytes_per_token(self) -> int:
        """K + V bytes of one token over all paged caches."""
        return sum(s.bytes_per_token for s in self.paged)

    def describe(self) -> str:
        """One line, e.g. '4 caches in 4 slots: 2 full, 2 sliding (window 16), 0 auxiliary; ...'."""
        parts = [f"{len(self.paged)} full"]
        sliding = f"{len(self.sliding)} sliding"
        if self.sliding_window is not None:
            sliding += f" (window {self.sliding_window})"
        parts += [sliding, f"{len(self.auxiliary)} auxiliary"]
        shapes = sorted({s.describe_kv() for s in self.caches if s.kind != AUXILIARY})
        notes = sorted({s.note for s in self.caches if s.note and s.kind != FULL})
        kept = sorted({s.note for s in self.paged if s.note})
        text = (
            f"{len(self.caches)} caches in {self.slots or len(self.caches)} slots: "
            f"{', '.join(parts)}; "
            f"KV heads x head dim: {', '.join(shapes) or 'none'}; "
            f"{self.bytes_per_token:,} pooled bytes/token; cached as {self.cached_as}"
        )
        text += f" (snapshotted: {'; '.join(notes)})" if notes else ""
        return text + (f" (KV at full precision: {'; '.join(kept)})" if kept else "")


def cache_layout(model) -> CacheLayout:
    """Classify every cache of the loaded mlx-lm ``model``; ``ValueError`` if it can't."""
    try:
        caches = make_prompt_cache(model)
    except Exception as e:  # noqa: BLE001  (any model failure becomes one clear error)
        raise ValueError(
            f"{type(model).__name__} cannot make its caches ({type(e).__name__}: {e})"
        ) from e
    if not caches or all(c is None for c in caches):
        raise ValueError(f"{type(model).__name__} makes no caches")
    _run_probe(model, caches)
    specs: list[CacheSpec] = []
    for slot, cache in enumerate(caches):
        if cache is None:
            continue  # a slot no layer uses
        if isinstance(cache, CacheList):
            for member, inner in enumerate(cache.caches):
                specs.append(_spec(len(specs), slot, member, inner))
        else:
            specs.append(_spec(len(specs), slot, None, cache))
    return CacheLayout(tuple(specs), len(caches))


def cache_at(caches: list, path: CachePath):
    """The cache object at ``path`` of a model's cache list."""
    slot, member = path
    return caches[slot] if member is None else caches[slot].caches[member]


def put_cache(caches: list, path: CachePath, cache) -> None:
    """Put ``cache`` at ``path`` of a model's cache list (a ``CacheList``'s member replaced)."""
    slot, member = path
    if member is None:
        caches[slot] = cache
    else:
        members = list(caches[slot].caches)
        members[member] = cache
        caches[slot].caches = tuple(members)


def dtype_from_name(name: str) -> mx.Dtype:
    """``"float32"`` -> ``mx.float32``."""
    dtype = getattr(mx, name, None)
    if not isinstance(dtype, mx.Dtype):
        raise ValueError(f"not an mlx dtype: {name!r}")
    return dtype


def dtype_name(dtype: mx.Dtype) -> str:
    """``mx.float32`` -> ``"float32"``."""
    return str(dtype).rsplit(".", 1)[-1]


def _run_probe(model, caches: list) -> None:
    """Fill fresh ``caches`` with ``PROBE_TOKENS`` tokens (lazily: shapes need no evaluation)."""
    try:
        model(mx.array([list(range(PROBE_TOKENS))], dtype=mx.int32), cache=caches)
    except Exception as e:  # noqa: BLE001  (any model failure becomes one clear error)
        raise ValueError(
            f"cannot read the KV shapes of {type(model).__name__}: "
            f"a {PROBE_TOKENS}-token forward failed ({type(e).__name__}: {e})"
        ) from e


def _spec(index: int, slot: int, member: int | None, cache) -> CacheSpec:
    """The spec of one cache object after the trial forward."""
    name = type(cache).__name__
    common = dict(index=index, slot=slot, member=member, cache_type=name)
    if isinstance(cache, CacheList):
        return CacheSpec(kind=AUXILIARY, note=f"{name} inside a CacheList", **common)
    if type(cache) is RotatingKVCache:
        shapes = _kv_shapes(cache)
        if shapes is None:  # written in no way we can read: its state is still snapshotted
            return CacheSpec(kind=SLIDING, window=cache.max_size, keep=cache.keep, **common)
        return CacheSpec(kind=SLIDING, window=cache.max_size, keep=cache.keep, **shapes, **common)
    if type(cache) not in PAGEABLE:
        note = "" if _is_state(cache) else f"{name}: not plain K/V"
        return CacheSpec(kind=AUXILIARY, note=note, **common)
    shapes = _kv_shapes(cache)
    if shapes is None:
        return CacheSpec(
            kind=AUXILIARY, note=f"{name} holding no plain K/V after a trial forward", **common
        )
    if getattr(cache, "offset", None) != PROBE_TOKENS:
        return CacheSpec(kind=AUXILIARY, note=f"{name} not one row per token", **common)
    return CacheSpec(kind=FULL, **shapes, **common)


def _kv_shapes(cache) -> dict | None:
    """Heads, dims and dtype of a K/V cache's keys and values (None: not a K/V pair we page)."""
    keys, values = getattr(cache, "keys", None), getattr(cache, "values", None)
    if not isinstance(keys, mx.array) or not isinstance(values, mx.array):
        return None
    if keys.ndim != 4 or values.ndim != 4 or keys.shape[0] != 1 or values.shape[0] != 1:
        return None
    if keys.dtype != values.dtype:
        return None
    return dict(
        key_heads=keys.shape[1],
        key_dim=keys.shape[3],
        value_heads=values.shape[1],
        value_dim=values.shape[3],
        dtype=dtype_name(keys.dtype),
    )


def _is_state(cache) -> bool:
    """Whether ``cache`` is recurrent / linear-attention state by nature (no note needed)."""
    return not hasattr(cache, "keys") or not hasattr(cache, "values")


def _path_text(path: CachePath) -> str:
    slot, member = path
    return f"{slot}" if member is None else f"{slot}.{member}"
