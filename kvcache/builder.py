"""Build the KV cache of a loaded model: layout, pool, allocator, tree."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kvcache.kv_format import FULL_PRECISION, KVFormat
from kvcache.kv_pages import apply_format
from kvcache.layout import CacheLayout, cache_layout
from kvcache.pool import KVPagePool, PageAllocator, pool_pages_for_budget
from kvcache.radix_cache import RadixCache

log = logging.getLogger(__name__)

DEFAULT_PAGE_SIZE = 16


SEGMENT_BYTES = 32 << 20  # the pool grows by this much at a time (RAM on demand)


@dataclass(frozen=True)
class KVCacheBuildResult:
    """Everything the engine needs to cache KV for one model, built once per load; its
    fields named as :class:`kvcache.prefix_cache.PrefixCache` names them."""

    layout: CacheLayout | None
    page_size: int
    pool: KVPagePool | None
    allocator: PageAllocator
    disable_radix_cache: bool
    disable_reason: str | None
    tree: RadixCache


def build_kv_cache(
    model,
    *,
    weight_bytes: int,
    page_size: int = DEFAULT_PAGE_SIZE,
    pool_tokens: int | None = None,
    pool_bytes: int | None = None,
    memory_fraction: float = 0.25,
    disable: bool = False,
    segment_bytes: int | None = SEGMENT_BYTES,
    kv_format: KVFormat = FULL_PRECISION,
) -> KVCacheBuildResult:
    """Lay out, size and preallocate the cache; a model we can't page gets a disabled tree.

    ``pool_tokens`` (a size in tokens) or ``pool_bytes`` (a RAM budget) overrides the memory
    budget (``memory_fraction`` of the device's recommended working set, or of available RAM,
    minus the weights). The pool takes that budget in segments of about ``segment_bytes`` as it
    fills (None: all of it at once). ``kv_format``: how full-attention K/V are stored
    (``kvcache.kv_format``: quantized, the same budget holds more tokens).
    """
    reason = "disabled by the user (--no-cache)" if disable else None
    layout = None
    try:
        layout = apply_format(model, cache_layout(model), kv_format)
    except ValueError as exc:
        reason = reason or f"cache layout not supported: {exc}"
    pages = 0
    if layout is not None and reason is None:
        pages = pool_pages_for_budget(
            layout,
            page_size,
            weight_bytes=weight_bytes,
            fraction=memory_fraction,
            tokens=pool_tokens,
            budget_bytes=pool_bytes,
        )
        if layout.paged and pages == 0:
            reason = "no memory left for a KV pool"
    pool = None
    if layout is not None and reason is None:
        page_bytes = layout.bytes_per_token * page_size
        segment = max(1, segment_bytes // page_bytes) if segment_bytes and page_bytes else None
        pool = KVPagePool(layout, pages, page_size, segment_pages=segment)
    allocator = PageAllocator(pages, pool.reserved_pages if pool is not None else None)
    hybrid = layout is not None and (layout.is_hybrid_swa or layout.is_hybrid_ssm)

    def free_slots(slots: tuple[int, ...]) -> None:
        allocator.decref([slot // page_size for slot in slots if slot >= 0])  # < 0: placeholder

    tree = RadixCache(free_slots, require_snapshots=hybrid, disable=reason is not None)
    if reason is not None:
        log.warning("radix cache disabled: %s", reason)
    else:
        log.info("KV cache: %s; %d pages of %d tokens", layout.describe(), pages, page_size)
    return KVCacheBuildResult(
        layout=layout,
        page_size=page_size,
        pool=pool,
        allocator=allocator,
        disable_radix_cache=reason is not None,
        disable_reason=reason,
        tree=tree,
    )
