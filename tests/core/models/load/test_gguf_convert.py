"""The GGUF conversion without a model file: every type MLX can hold converted exactly in
both layouts, the lossy 8-bit step for the rest, whole files through the header, and the
conversion cache (round trip, checks, a touched file re-hashed once, failures that only
cost time)."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from core.models import hashing
from core.models.load import gguf_convert
from core.models.load.gguf_convert import (
    ConversionCache,
    convert_tensor,
    convert_tensors,
    default_layout,
)
from core.models.load.gguf_header import TensorInfo, read_header


@pytest.mark.parametrize(
    "kind", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K], ids=lambda k: k.name
)
def test_conversion_is_exact(kind):
    """Random blocks of every type MLX can hold: both layouts give gguf's values exactly."""
    rng = np.random.default_rng(int(kind))
    block_size, type_size = GGML_QUANT_SIZES[kind]
    rows, cols = 16, 512
    blocks = rng.integers(0, 256, size=(rows * cols // block_size, type_size), dtype=np.uint8)
    halves = 2 if kind in (T.Q4_1, T.Q5_1, T.Q4_K, T.Q5_K) else 1  # d (and m / dmin) come first
    blocks[:, : 2 * halves] = (
        rng.uniform(-0.1, 0.1, (len(blocks), halves)).astype(np.float16).view(np.uint8)
    )
    raw = blocks.reshape(-1)
    info = TensorInfo("x.weight", (rows, cols), kind, 0, raw.size)
    expected = gguf.quants.dequantize(raw.reshape(rows, -1), kind)
    assert np.array_equal(np.array(convert_tensor(info, raw, "float32")["x.weight"]), expected)
    packed = convert_tensor(info, raw, "affine")
    bits = packed["x.weight"].shape[-1] * 32 // cols
    values = mx.dequantize(
        packed["x.weight"],
        packed["x.scales"].astype(mx.float32),
        packed["x.biases"].astype(mx.float32),
        group_size=32,
        bits=bits,
    )
    assert np.array_equal(np.array(values), expected)


def _entry(tmp_path: Path) -> tuple[ConversionCache, dict]:
    cache = ConversionCache.under(tmp_path, "ab" * 32, "float32")
    config = {"model_type": "test", "layers": 2}
    cache.save(config, {"a": mx.arange(10, dtype=mx.float32), "b": mx.ones((3, 4))})
    return cache, config


def _rewrite_meta(folder: Path, **changes) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, **changes}))


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: (f / "meta.json").unlink(),  # a partial entry
        lambda f: (f / "meta.json").write_text("{not json"),
        lambda f: (f / "config.json").write_text('{"model_type": "other"}'),
        lambda f: _rewrite_meta(f, source_sha256="cd" * 32),
        lambda f: _rewrite_meta(f, tensor_count=3),
        lambda f: _rewrite_meta(f, format=0),
        lambda f: os.truncate(f / "weights.safetensors", 40),
        lambda f: (f / "weights.safetensors").write_bytes(
            b"\0" * (f / "weights.safetensors").stat().st_size
        ),
    ],
    ids=[
        "no-meta",
        "bad-meta",
        "other-config",
        "other-source",
        "tensor-count",
        "old-format",
        "truncated",
        "zeroed",
    ],
)
def test_damaged_cache_entries_are_dropped(tmp_path, damage):
    cache, config = _entry(tmp_path)
    assert set(cache.load(config)) == {"a", "b"}
    damage(cache.folder)
    assert cache.load(config) is None and not cache.folder.exists()


def test_unquantized_types_keep_their_values():
    values = np.arange(-8, 8, dtype=np.float32).reshape(4, 4) / 4
    for kind, dtype, mlx_dtype in [(T.F32, "<f4", mx.float32), (T.F16, "<f2", mx.float16)]:
        raw = values.astype(dtype).view(np.uint8).reshape(-1)
        info = TensorInfo("n.weight", (4, 4), kind, 0, raw.size)
        assert np.array_equal(np.array(convert_tensor(info, raw, "float32")["n.weight"]), values)
        stored = convert_tensor(info, raw, "affine")
        assert list(stored) == ["n.weight"] and stored["n.weight"].dtype == mlx_dtype
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")  # these values are exact in bfloat16
    info = TensorInfo("n.weight", (4, 4), T.BF16, 0, bf16.nbytes)
    assert np.array_equal(
        np.array(convert_tensor(info, bf16.view(np.uint8), "float32")["n.weight"]), values
    )
    assert convert_tensor(info, bf16.view(np.uint8), "affine")["n.weight"].dtype == mx.bfloat16


def test_types_without_an_mlx_layout_become_8_bit_in_the_affine_layout():
    rng = np.random.default_rng(6)
    block_size, type_size = GGML_QUANT_SIZES[T.Q6_K]
    blocks = rng.integers(0, 256, size=(8 * 256 // block_size, type_size), dtype=np.uint8)
    # d comes last
    blocks[:, -2:] = rng.uniform(-0.01, 0.01, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    raw = blocks.reshape(-1)
    info = TensorInfo("m.weight", (8, 256), T.Q6_K, 0, raw.size)
    exact = gguf.quants.dequantize(raw.reshape(8, -1), T.Q6_K)
    assert np.array_equal(np.array(convert_tensor(info, raw, "float32")["m.weight"]), exact)
    packed = convert_tensor(info, raw, "affine")
    assert (
        set(packed) == {"m.weight", "m.scales", "m.biases"}
        and packed["m.scales"].dtype == mx.float16
    )
    back = np.array(
        mx.dequantize(
            packed["m.weight"], packed["m.scales"], packed["m.biases"], group_size=32, bits=8
        )
    )
    step = np.abs(exact).max() / 127
    assert np.abs(back - exact).max() <= step  # the one lossy step: within one 8-bit level


def test_unknown_layout_is_refused():
    info = TensorInfo("n.weight", (2,), T.F32, 0, 8)
    with pytest.raises(ValueError, match="unknown layout"):
        convert_tensors(Path("unused"), gguf_convert.GGUFHeader({}, (info,)), "float16")
    with pytest.raises(ValueError, match="unknown layout"):
        ConversionCache.under(Path("unused"), "ab" * 32, "int4")


def test_default_layout_follows_the_device():
    assert default_layout() == ("affine" if mx.default_device() == mx.gpu else "float32")


def test_a_whole_file_converts_through_its_header(tmp_path):
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    f32 = np.arange(64, dtype=np.float32).reshape(8, 8)
    q8 = gguf.quants.quantize(np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64), T.Q8_0)
    writer.add_tensor("a.weight", f32)
    writer.add_tensor("b.weight", q8, raw_dtype=T.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_header(path)
    flat = convert_tensors(path, header, "float32")
    assert set(flat) == {"a.weight", "b.weight"}
    assert np.array_equal(np.array(flat["a.weight"]), f32)
    assert np.array_equal(np.array(flat["b.weight"]), gguf.quants.dequantize(q8, T.Q8_0))
    affine = convert_tensors(path, header, "affine")
    assert set(affine) == {"a.weight", "b.weight", "b.scales", "b.biases"}


def test_cache_round_trip_and_layout_folders(tmp_path):
    cache, config = _entry(tmp_path)
    assert cache.folder == tmp_path / "converted" / ("ab" * 16) / "float32"
    weights = cache.load(config)
    assert np.array_equal(np.array(weights["a"]), np.arange(10, dtype=np.float32))
    meta = json.loads((cache.folder / "meta.json").read_text())
    assert meta["format"] == gguf_convert.CACHE_FORMAT and meta["tensor_count"] == 2
    assert meta["weights_sha256"] == hashing.sha256_file(cache.folder / gguf_convert.WEIGHTS_FILE)
    # another layout
    assert ConversionCache.under(tmp_path, "ab" * 32, "affine").load(config) is None
    assert not list(cache.folder.parent.glob(".float32.*"))  # no temp folder left


def test_a_touched_weights_file_is_hashed_once_then_trusted(tmp_path, monkeypatch):
    cache, config = _entry(tmp_path)
    reads = []
    real = hashing.sha256_file
    monkeypatch.setattr(
        hashing, "sha256_file", lambda p, on_fraction=None: reads.append(p) or real(p, on_fraction)
    )
    assert cache.load(config) is not None and reads == []  # unchanged: not read
    weights = cache.folder / gguf_convert.WEIGHTS_FILE
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert cache.load(config) is not None and len(reads) == 1  # touched: checked
    assert (
        json.loads((cache.folder / "meta.json").read_text())["weights_mtime_ns"]
        == st.st_mtime_ns + 10**9
    )
    assert cache.load(config) is not None and len(reads) == 1  # the check was remembered


def test_a_failed_save_is_logged_not_raised(tmp_path, caplog):
    blocker = tmp_path / "converted"
    blocker.write_text("a file where the folder should be")
    cache = ConversionCache.under(tmp_path, "ab" * 32, "float32")
    with caplog.at_level(logging.WARNING, logger=gguf_convert.__name__):
        cache.save({"model_type": "test"}, {"a": mx.ones(3)})
    assert "could not keep converted weights" in caplog.text
    assert cache.load({"model_type": "test"}) is None


def test_stale_temp_folders_are_removed_fresh_ones_kept(tmp_path):
    parent = tmp_path / "converted" / ("ab" * 16)
    stale, fresh = parent / ".float32.stale", parent / ".float32.fresh"
    stale.mkdir(parents=True)
    fresh.mkdir()
    hour_ago = time.time() - 3700
    os.utime(stale, (hour_ago, hour_ago))
    _entry(tmp_path)
    assert not stale.exists() and fresh.exists()


@pytest.mark.faults
def test_a_second_process_s_conversion_leaves_the_first_one_in_place(tmp_path):
    """Two processes converting the same file at once: the one that finishes second finds
    the other's entry in place and keeps it (a reader may have it open). Today: it removed
    that entry and put its own in its place."""
    cache, config = _entry(tmp_path)
    kept = (cache.folder / gguf_convert.WEIGHTS_FILE).stat().st_ino
    # the other process
    cache.save(config, {"a": mx.arange(10, dtype=mx.float32), "b": mx.ones((3, 4))})
    assert (cache.folder / gguf_convert.WEIGHTS_FILE).stat().st_ino == kept
    # its temporary folder is gone
    assert sorted(p.name for p in cache.folder.parent.iterdir()) == ["float32"]
    weights = cache.load(config)
    assert weights is not None and mx.array_equal(weights["a"], mx.arange(10, dtype=mx.float32))
