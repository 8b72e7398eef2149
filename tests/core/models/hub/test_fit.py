"""Whether a model fits: the weights as this backend holds them, the KV pool the engine
would give them, and this machine's memory."""

from __future__ import annotations

from core.models.hub.fit import (
    FITS,
    KV_POOL_MAX_BYTES,
    Fit,
    describe_fit,
    estimate_fit,
    kv_pool_bytes,
    machine_memory_bytes,
)

GB = 2**30


def test_fit_estimate_and_kv_pool_follow_the_engine():
    from kvcache import pool

    assert KV_POOL_MAX_BYTES == pool.DEFAULT_MAX_POOL_BYTES
    fit = estimate_fit("gguf", 100 * 2**20, 135_000_000, on_cpu=True, machine_bytes=8 * GB)
    assert fit.weights_bytes == 540_000_000 and fit.kv_pool_bytes == 2 * GB - 540_000_000
    # past a quarter of memory: the minimum pool only
    assert kv_pool_bytes(3 * GB, 8 * GB) == 0


def test_machine_memory_is_psutils_figure():
    import psutil

    assert machine_memory_bytes() == psutil.virtual_memory().total


def test_describe_fit_says_the_label_and_the_sizes():
    assert describe_fit(Fit(3 * GB, GB, 16 * GB, FITS)) == "fits: ~4.0 of 16 GB"
    assert describe_fit(None) == "size unknown"
