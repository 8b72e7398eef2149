"""The engine's figures for panels and metrics (``Engine.stats()``): plain values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvcache.stats import CacheStats, DiskTierStats

if TYPE_CHECKING:  # core.models.load.loader imports mlx
    from core.models.load.loader import ModelInfo


@dataclass(frozen=True)
class EngineStats:
    """Plain figures for panels and metrics: the model, the cache, MLX memory."""

    model: ModelInfo | None = None
    cache: CacheStats | None = None
    mlx_active_bytes: int = 0
    mlx_cache_bytes: int = 0
    mlx_peak_bytes: int = 0
    requests_served: int = 0
    requests_running: int = 0
    rss_bytes: int = 0  # the whole process (read when stats() is called)
    disk_cache_bytes: int = 0  # the KV cache database on disk, WAL included (idem)
    disk_cache_budget_bytes: int = 0  # 0 while the disk cache is off
    # files made from models at load (tokenizers, kept conversions), counted in the budget
    derived_bytes: int = 0
    disk: DiskTierStats | None = None  # the disk tier's reads and writes (None while off)


def process_rss() -> int:
    """The process's resident memory now (one /proc read: cheap enough to poll a few times
    a second); 0 where it cannot be read."""
    import psutil

    try:
        return psutil.Process().memory_info().rss
    except psutil.Error:
        return 0
