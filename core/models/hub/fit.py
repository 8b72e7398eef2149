"""Whether a model fits this machine, estimated before any byte is downloaded.

The estimate is the one :mod:`core.models.catalog` makes of local files: the weights as this
backend will hold them (float32 on the CPU) plus the KV pool the engine would give them (a
quarter of the memory less the weights, at most 2 GiB: kvcache.pool's defaults), against this
machine's memory. The hub's search results and download plans carry one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from core.models.catalog import estimate_memory_bytes, runs_on_cpu

# kvcache.pool's default budget for the KV pool (a test keeps these equal to its own).
KV_POOL_FRACTION = 0.25
KV_POOL_MAX_BYTES = 2 << 30
FITS, TIGHT, WONT_FIT = "fits", "tight", "won't fit"
FIT_LIMITS = ((0.70, FITS), (0.90, TIGHT))  # share of the machine's memory


@dataclass(frozen=True)
class Fit:
    """The memory a model takes once loaded against this machine's."""

    weights_bytes: int  # as this backend holds them
    kv_pool_bytes: int
    machine_bytes: int
    label: str  # FITS | TIGHT | WONT_FIT

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_pool_bytes


def machine_memory_bytes() -> int:
    """The machine's RAM: from sysconf where there is one (what psutil reads on Linux and
    macOS, without importing it: a pull is a new Python each time), else psutil."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        import psutil

        return int(psutil.virtual_memory().total)


def kv_pool_bytes(weights_bytes: int, machine_bytes: int) -> int:
    """The KV pool the engine would give a model of ``weights_bytes`` (kvcache.pool's budget)."""
    return max(0, min(int(KV_POOL_FRACTION * machine_bytes) - weights_bytes, KV_POOL_MAX_BYTES))


def estimate_fit(
    kind: str,
    size_bytes: int,
    parameters: int | None,
    on_cpu: bool | None = None,
    machine_bytes: int | None = None,
) -> Fit:
    """Weights as this backend holds them plus the KV pool, against the machine's memory:
    fits (up to 70 %), tight (up to 90 %), won't fit."""
    on_cpu = runs_on_cpu() if on_cpu is None else on_cpu
    machine = machine_memory_bytes() if machine_bytes is None else machine_bytes
    weights = estimate_memory_bytes(kind, size_bytes, on_cpu, parameters)
    pool = kv_pool_bytes(weights, machine)
    share = (weights + pool) / machine if machine else float("inf")
    label = next((name for limit, name in FIT_LIMITS if share <= limit), WONT_FIT)
    return Fit(weights, pool, machine, label)


def describe_fit(fit: Fit | None) -> str:
    if fit is None:
        return "size unknown"
    return f"{fit.label}: ~{fit.total_bytes / 2**30:.1f} of {fit.machine_bytes / 2**30:.0f} GB"
