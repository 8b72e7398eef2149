"""A model split by layers (mlx-lm's pipeline) over 2 ranks on loopback, end to end: greedy
replies the same as one process's, uncached, cached and after a restart of the group, each
rank holding and persisting the K/V of its own layers only."""

from __future__ import annotations

import sqlite3

import pytest

from core.distributed.shard import rank_cache_name
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.serialize import unpack_arrays
from tests.core.distributed.group_fixture import needs_ring, start_group
from tests.core.distributed.test_group import (
    OTHER,
    TOKENS,
    cached,
    expectations,
    first_group,
    follow_up,
    text,
)
from tests.kvcache.family_weights import write_family

pytestmark = [needs_ring, pytest.mark.distributed]


def stored_kv_shapes(store) -> set[tuple[tuple[int, ...], ...]]:
    """The shapes of the K/V arrays in every page of a rank's disk store."""
    with sqlite3.connect(store) as db:
        blobs = [row[0] for row in db.execute("SELECT kv FROM page_data WHERE kv IS NOT NULL")]
    return {tuple(tuple(a.shape) for a in unpack_arrays(blob)[1]) for blob in blobs}


def restarted_group_restores(model, data, tmp_path, expected, extra=()) -> None:
    """A restart of the group: a session's follow-up and another session restore from both
    ranks' disk slices and answer as one process does."""
    group = start_group(model, data, tmp_path, extra)
    try:
        a2 = group.chat(follow_up(expected["lyon"]), session="lyon", max_tokens=TOKENS)
        assert text(a2) == expected["evening"]
        assert cached(a2) > 0, group.output()
        b1 = group.chat(OTHER, session="other", max_tokens=TOKENS)
        assert text(b1) == expected["other"] and cached(b1) > 0
        assert "out of step" not in group.output()
    finally:
        group.stop()


def test_a_dense_model_pipelined_when_asked_answers_as_one_process_and_restores(tmp_path):
    # qwen2 splits both ways: --split pipeline asks for layers; 4 layers, 2 a rank
    spec = TinyModelSpec(kind="qwen2", num_layers=4, max_position_embeddings=8192)
    model = write_tiny_model(tmp_path / "tiny-qwen2", spec)
    expected = expectations(model)
    data = tmp_path / "data"
    group = start_group(model, data, tmp_path, ("--split", "pipeline"))
    try:
        assert "pipelined: 2 of 4 layers each" in group.output()
        first_group(group, expected)
    finally:
        group.stop()
    # each rank's slice: its 2 layers' K and V, every KV head (not half of 4 layers')
    for rank in (0, 1):
        shapes = stored_kv_shapes(data / rank_cache_name(rank, 2))
        assert shapes and all(
            len(page) == 2 * 2 and all(s[0] == spec.num_kv_heads for s in page) for page in shapes
        ), shapes
    restarted_group_restores(model, data, tmp_path, expected, ("--split", "pipeline"))


def test_a_hybrid_model_only_mlx_lm_pipelines_runs_pipelined_and_restores(tmp_path):
    # qwen3_next (linear-attention layers, a full one every 4th) has no tensor split: the
    # group pipelines it by itself. Layers 0-2 are linear attention, 3 full: one rank's slice
    # is linear only (snapshots, no pages: cached as a pure recurrent model is), the other's
    # pages its full layer and snapshots its linear one
    model = write_family(
        tmp_path / "tiny-qwen3-next",
        "qwen3_next",
        num_hidden_layers=4,
        full_attention_interval=4,
        max_position_embeddings=8192,
    )
    expected = expectations(model)
    data = tmp_path / "data"
    group = start_group(model, data, tmp_path)
    try:
        assert "pipelined: 2 of 4 layers each" in group.output()
        first_group(group, expected)
    finally:
        group.stop()
    # on disk: one rank's pages hold K/V arrays, the linear-only rank's none (its snapshots do)
    paged = [stored_kv_shapes(data / rank_cache_name(rank, 2)) for rank in (0, 1)]
    assert sorted(any(paged[rank]) for rank in (0, 1)) == [False, True], paged
    restarted_group_restores(model, data, tmp_path, expected)


def test_an_mla_model_pipelined_answers_as_one_process_and_restores(tmp_path):
    # deepseek_v3 caches one compressed latent per token as its keys (16 wide here) and the
    # rope part as its values (8 wide): pages of their own shapes, 2 of 4 layers a rank
    model = write_family(
        tmp_path / "tiny-deepseek-v3",
        "deepseek_v3",
        num_hidden_layers=4,
        max_position_embeddings=8192,
    )
    expected = expectations(model)
    data = tmp_path / "data"
    group = start_group(model, data, tmp_path, ("--split", "pipeline"))
    try:
        assert "pipelined: 2 of 4 layers each" in group.output()
        first_group(group, expected)
    finally:
        group.stop()
    for rank in (0, 1):  # each rank's slice: its 2 layers' latent (1 x 16) and rope part (1 x 8)
        shapes = stored_kv_shapes(data / rank_cache_name(rank, 2))
        assert shapes and all(
            [(s[0], s[2]) for s in page] == [(1, 16), (1, 8)] * 2 for page in shapes
        ), shapes
    restarted_group_restores(model, data, tmp_path, expected, ("--split", "pipeline"))
