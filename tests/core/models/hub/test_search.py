"""Searching the hub, against the loopback hub: what each result says, and whether it fits."""

from __future__ import annotations

import pytest

from core.models.hub.client import HubError
from core.models.hub.fit import FITS, KV_POOL_MAX_BYTES, TIGHT, WONT_FIT
from core.models.hub.search import search
from tests.core.models.hub.hub_fixture import (
    BIG_MLX,
    GATED,
    GIANT_MLX,
    MAMBA_GGUF,
    OTHER_MLX,
    TINY_MLX,
    TWO_GGUF,
)

GB = 2**30


def test_search_lists_mlx_first_then_gguf_with_fits(loopback_hub, hub_sources):
    results = search("tiny", on_cpu=True, machine_bytes=16 * GB)
    ids = [r.repo_id for r in results]
    # MLX before GGUF; mlx-community first, then by downloads; private repos never listed
    assert ids == [TINY_MLX, BIG_MLX, OTHER_MLX, GATED, TWO_GGUF]
    tiny = results[0]
    assert tiny.kind == "mlx" and tiny.architecture == "llama" and tiny.problem is None
    assert (
        tiny.parameters == hub_sources.parameters and tiny.size_bytes == 4 * hub_sources.parameters
    )
    assert tiny.fit.label == FITS and tiny.fit.weights_bytes == 4 * hub_sources.parameters
    # a quarter of 16 GB is more than the cap
    assert tiny.fit.kv_pool_bytes == KV_POOL_MAX_BYTES
    assert results[3].gated and not results[0].gated
    gguf = results[-1]
    assert gguf.kind == "gguf" and gguf.parameters == 448 and gguf.architecture == "llama"
    assert [q for q in ("mlx", "gguf") if ("GET", q)]  # both tags were asked for
    asked = [path for method, path in loopback_hub.requests if path.startswith("/api/models?")]
    assert any("filter=mlx" in p for p in asked) and any("filter=gguf" in p for p in asked)
    assert all("sort=downloads" in p for p in asked)


def test_search_fits_tight_and_wont_fit(loopback_hub):
    giant = search("giant", on_cpu=False, machine_bytes=48 * GB)[0]
    assert giant.repo_id == GIANT_MLX and giant.quantization == "4bit"
    assert giant.parameters == 70_000_000_000 + 2_000_000_000  # U32 words hold 8 4-bit weights
    assert giant.size_bytes == 70_000_000_000 // 2 + 4_000_000_000  # on Metal: as stored
    assert giant.fit.label == TIGHT  # 39 GB of 51.5 GB (48 GiB): tight
    assert search("giant", on_cpu=False, machine_bytes=32 * GB)[0].fit.label == WONT_FIT
    assert search("giant", on_cpu=False, machine_bytes=128 * GB)[0].fit.label == FITS
    on_cpu = search("giant", on_cpu=True, machine_bytes=128 * GB)[0]
    assert on_cpu.fit.weights_bytes == 4 * 72_000_000_000 and on_cpu.fit.label == WONT_FIT


def test_unsupported_families_are_shown(loopback_hub):
    mamba = search("mamba")[0]
    assert mamba.repo_id == MAMBA_GGUF and "can't map" in mamba.problem


def test_empty_search_says_what_to_do(loopback_hub):
    with pytest.raises(HubError, match="search for something"):
        search("  ")
    assert search("zzz-nothing-matches") == []
