"""Plain figures about the KV cache: safe to hand to any thread (no mlx import here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CacheStats:
    """A plain snapshot of the cache's state, for panels, metrics and the CLI."""

    enabled: bool
    disabled_reason: str | None
    page_size: int
    pages_total: int
    pages_used: int
    pages_evictable: int
    pages_locked: int
    pool_bytes: int  # allocated now (reserved)
    tree_nodes: int
    tree_tokens: int
    snapshots: int
    snapshot_bytes: int
    hits: int
    misses: int
    hit_tokens: int
    prompt_tokens: int  # prompt tokens seen by match(): hit_tokens / prompt_tokens = hit rate
    evicted_tokens: int
    evicted_pages: int
    sessions: int
    pages_reserved: int = 0  # pages with memory now: the pool grows in segments up to pages_total
    pool_budget_bytes: int = 0  # the pool's bytes once grown to pages_total (0: as pool_bytes)
    # cache namespaces holding something in RAM (prefixes are shared only inside one)
    namespaces: int = 0
    # How a prefix of this model is kept (kvcache.layout.CacheLayout.cached_as): "pages" (K/V
    # paged), "snapshots" (state snapshots only: no full-attention layer) or "pages+snapshots";
    # "" while the cache is off. ``layout``: the layout in one line (CacheLayout.describe).
    cached_as: str = ""
    layout: str = ""
    # How K/V are stored, per layer kind present ((kind, format) pairs, kinds as the layout
    # names them: "full", "sliding", "auxiliary"; kvcache.kv_pages.formats_by_kind), e.g.
    # (("full", "8-bit (group 64)"), ("sliding", "float32 (mlx-lm has no ...)")).
    kv_formats: tuple[tuple[str, str], ...] = ()

    @property
    def kv_format(self) -> str:
        """The KV format in one line: "full: 8-bit (group 64); sliding: float32 (...)"."""
        return "; ".join(f"{kind}: {fmt}" for kind, fmt in self.kv_formats)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True)
class DiskTierStats:
    """Plain figures of the disk tier since the model loaded (any thread may hold them)."""

    indexed_pages: int  # pages of the loaded model the disk holds (as this process knows)
    reads: int  # restores that brought pages back
    read_tokens: int
    read_bytes: int
    skipped_reads: int  # a restore that computing would beat (measured rates)
    pages_written: int  # new pages (a stored page is never written again)
    bytes_written: int
    pages_not_rewritten: int  # pages a save found already stored (not serialized)
    write_backs: int  # prefixes RAM evicted and handed down (written only where new)
    write_errors: int
    writes_stopped: str | None  # why writes are off now (disk full...), or None
    read_bytes_per_s: float  # measured (0 until a read)
    prefill_tokens_per_s: float  # measured (0 until a prefill)
