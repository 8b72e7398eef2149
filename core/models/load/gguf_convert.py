"""GGUF files MLX's own reader cannot keep: exact conversion, and a cache of the result.

``mx.load`` keeps Q4_0 / Q4_1 / Q8_0 quantized, but it gives up on a whole file at the
first Q5_0 tensor ("gguf_tensor_to_f16 failed"), turns Q6_K into float16, and turns Q4_K
into float16 *wrongly* (every second 32-value sub-block gets the wrong scale and min). So
files with any other tensor type never go through it; they are converted here, exactly,
into one of two layouts:

- ``float32`` (the CPU default): every tensor dequantized to float32. This is what the
  CPU runs fastest (quantized matmuls are slow on MLX's CPU backend, and so is its
  ``mx.dequantize``, measured: docs/benchmarks.md), so a cached load
  is just reading the file. The values equal ``gguf.quants.dequantize``'s bit for bit.
- ``affine`` (the Metal default): every type whose values are ``scale * q + bias`` over
  groups of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K) is repacked bit for bit into
  MLX's affine triples (``weight`` / ``scales`` / ``biases``; 4, 5 or 8 bits, group 32),
  so ``stored`` keeps the file's own quantization with nothing re-quantized, and
  ``mx.dequantize`` gives the exact float32 values back. Matrices of types MLX has no
  layout for (Q6_K, Q2_K, Q3_K: groups of 16; IQ*) are re-quantized to MLX 8-bit affine
  (group 32; a step about a quarter of Q6_K's own), the one lossy step; F32 / F16 / BF16
  stay as they are. Scales and biases are float16 where that is exact (Q8_0 / Q4_0 /
  Q5_0 ...), else float32 (K-quants); the embedding's scale dtype becomes the activation
  dtype (float16 for Gemma's Q8_0 embedding, as in mlx-lm's float16 Gemma models).

The model loader's weights format applies afterwards; on the CPU, ``stored`` of a
converted file is therefore float32 (a file ``mx.load`` reads stays quantized).

A conversion that took long (``KEEP_AFTER_S``) is kept, so the next load reads it instead; a
quick one is done again at each load, with no copy on disk: a float32 copy is about four times
the file (gemma3-270m: 1,023 MB for a 241 MB file) and, measured, reading it saved little over
converting again. A kept conversion is a derived file (``core.models.derived``: listed with its
model, removed with it, cleared by ``radixchat models clean``). It lives under
``<data>/converted/<sha256[:32]>/<layout>/`` (weights.safetensors,
config.json, meta.json), written into a temp folder and renamed into place. meta.json
records the format version, the source file's SHA-256, the tensor count and the weights
file's size, mtime and SHA-256 (re-hashed when size or mtime changed: ``core.models.hashing``);
an entry that fails any check is removed and rebuilt, so a damaged cache costs time, never a
wrong answer.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from core.errors import ModelLoadError
from core.models.hashing import FileDigest, recheck
from core.models.load.gguf_header import GGUFHeader, TensorInfo

log = logging.getLogger(__name__)

CACHE_FORMAT = 2  # bump when the conversion changes: older entries are rebuilt (2: Q/K un-permuted)
KEEP_AFTER_S = 20.0  # ConversionCache.keep_after_s: slower conversions are kept on disk
WEIGHTS_FILE = "weights.safetensors"

# ---------------------------------------------------------------- conversion

LAYOUTS = ("float32", "affine")


def default_layout() -> str:
    """``affine`` where MLX runs on the GPU (quantized kernels are fast there), else ``float32``."""
    return "affine" if mx.default_device() == mx.gpu else "float32"


def convert_tensors(path: Path, header: GGUFHeader, layout: str) -> dict[str, mx.array]:
    """Every tensor under its GGUF name; in the ``affine`` layout each quantized
    ``.weight`` has ``.scales`` / ``.biases`` beside it (as ``mx.load`` names them)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out: dict[str, mx.array] = {}
    for info in header.tensors:
        out.update(convert_tensor(info, data[info.offset : info.offset + info.nbytes], layout))
        mx.eval(list(out.values()))  # one tensor's temporaries at a time
    return out


def convert_tensor(info: TensorInfo, data: np.ndarray, layout: str) -> dict[str, mx.array]:
    """One tensor's raw bytes as MLX arrays, in ``layout`` (see the module docstring)."""
    kind, shape, name = info.ggml_type, info.shape, info.name
    if kind in (T.F32, T.F16, T.BF16):
        if kind == T.BF16:
            value = mx.array(data.view("<u2").reshape(shape)).view(mx.bfloat16)
        else:
            value = mx.array(data.view("<f4" if kind == T.F32 else "<f2").reshape(shape))
        return {name: value.astype(mx.float32) if layout == "float32" else value}
    if kind in _AFFINE and len(shape) == 2:
        q, scales, biases = _decode_affine(kind, data, shape)
        if layout == "float32":  # exact: scale * q has at most 22 significant bits
            groups = (
                q.astype(mx.float32).reshape(shape[0], -1, 32) * scales[..., None]
                + biases[..., None]
            )
            return {name: groups.reshape(shape)}
        stem = name.removesuffix(".weight")
        small = _fits_float16(scales) and _fits_float16(biases)
        dtype = mx.float16 if small else mx.float32  # exact either way
        bits = _AFFINE[kind][0]
        return {
            name: _pack(q, bits),
            f"{stem}.scales": scales.astype(dtype),
            f"{stem}.biases": biases.astype(dtype),
        }
    try:
        values = mx.array(
            gguf.quants.dequantize(data.reshape(*shape[:-1], -1), kind), dtype=mx.float32
        )
    except NotImplementedError:
        raise ModelLoadError(f"tensor {name}: GGML type {kind.name} is not supported") from None
    if layout == "float32" or len(shape) != 2 or shape[-1] % 32:
        return {name: values if layout == "float32" else values.astype(mx.float16)}
    weight, scales, biases = mx.quantize(values, group_size=32, bits=8)  # the one lossy step
    stem = name.removesuffix(".weight")
    return {
        name: weight,
        f"{stem}.scales": scales.astype(mx.float16),
        f"{stem}.biases": biases.astype(mx.float16),
    }


def _f16(column: np.ndarray) -> np.ndarray:
    return column.view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Packed 4-bit values of a 32-block: all low nibbles first, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """The fifth bit of a Q5 32-block, stored as one little-endian uint32."""
    word = np.ascontiguousarray(qh).view("<u4")
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _k_quant_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K low bits: 32 bytes hold sub-block 2c (low nibbles) and 2c+1 (high)."""
    n = qs.shape[0]
    shifted = qs.reshape(n, -1, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (shifted & 0x0F).reshape(n, -1)


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = gguf.quants.Q4_K.get_scale_min(np.ascontiguousarray(b[:, 4:16]))
    return d * sc.astype(np.float32), -(dmin * mn.astype(np.float32))


# Decoders of (n_blocks, type_size) bytes into q (n_blocks, block_size) and one scale and
# bias per 32 values, so that value = scale * q + bias, as ggml's dequantize_row_* has it.
def _q8_0(b):
    d = _f16(b[:, :2])
    return (b[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8), d, -128 * d


def _q4_0(b):
    d = _f16(b[:, :2])
    return _nibbles(b[:, 2:]), d, -8 * d


def _q4_1(b):
    return _nibbles(b[:, 4:]), _f16(b[:, :2]), _f16(b[:, 2:4])


def _q5_0(b):
    d = _f16(b[:, :2])
    return _nibbles(b[:, 6:]) | (_high_bits(b[:, 2:6]) << 4), d, -16 * d


def _q5_1(b):
    return _nibbles(b[:, 8:]) | (_high_bits(b[:, 4:8]) << 4), _f16(b[:, :2]), _f16(b[:, 2:4])


def _q4_k(b):
    return (_k_quant_nibbles(b[:, 16:144]), *_k_scales(b))


def _q5_k(b):
    n = b.shape[0]
    high = (b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    return (_k_quant_nibbles(b[:, 48:176]) | (high.reshape(n, -1) << 4), *_k_scales(b))


_AFFINE: dict[T, tuple[int, Callable]] = {  # type -> (bits of q, decoder)
    T.Q8_0: (8, _q8_0),
    T.Q4_0: (4, _q4_0),
    T.Q4_1: (4, _q4_1),
    T.Q5_0: (5, _q5_0),
    T.Q5_1: (5, _q5_1),
    T.Q4_K: (4, _q4_k),
    T.Q5_K: (5, _q5_k),
}


def _decode_affine(
    kind: T, data: np.ndarray, shape: tuple[int, ...]
) -> tuple[mx.array, mx.array, mx.array]:
    """q (rows, cols) as uint8, and scales / biases (rows, cols / 32) as float32."""
    _, decode = _AFFINE[kind]
    rows, cols = shape
    block_size, type_size = GGML_QUANT_SIZES[kind]
    by_row = data.reshape(rows, cols // block_size * type_size)
    step = max(1, (1 << 22) // cols)  # about 4M values at a time
    qs, scales, biases = [], [], []
    for start in range(0, rows, step):
        chunk = np.ascontiguousarray(by_row[start : start + step])
        n = chunk.shape[0]
        q, scale, bias = decode(chunk.reshape(-1, type_size))
        qs.append(mx.array(q.reshape(n, cols)))
        scales.append(mx.array(scale.reshape(n, -1)))
        biases.append(mx.array(bias.reshape(n, -1)))
    return mx.concatenate(qs), mx.concatenate(scales), mx.concatenate(biases)


def _pack(q: mx.array, bits: int) -> mx.array:
    """MLX's packing: each row a little-endian bit stream, value j at bit ``bits * j``."""
    if sys.byteorder != "little":  # pragma: no cover - every MLX platform is little-endian
        raise ModelLoadError("GGUF conversion needs a little-endian machine")
    rows = q.shape[0]
    if bits == 8:
        return q.view(mx.uint32)
    shifts = mx.arange(8, dtype=mx.uint64) * bits
    eights = q.reshape(rows, -1, 8).astype(mx.uint64) << shifts  # disjoint bits: the sum is an OR
    words = eights.sum(axis=-1)  # 8 values fill the low ``bits`` bytes of a uint64
    return words.view(mx.uint8).reshape(rows, -1, 8)[:, :, :bits].reshape(rows, -1).view(mx.uint32)


def _fits_float16(values: mx.array) -> bool:
    return bool(mx.array_equal(values.astype(mx.float16).astype(mx.float32), values))


# ---------------------------------------------------------------- cache


@dataclass(frozen=True)
class ConversionCache:
    """Where one GGUF file's converted weights live:
    ``<data>/converted/<sha256[:32]>/<layout>/``."""

    folder: Path
    source_sha256: str
    layout: str
    # a conversion is kept only when it took at least this long; a quicker one is done again
    # at each load, with no copy on disk (measured on gemma3-270m: docs/benchmarks.md)
    keep_after_s: float = field(default=KEEP_AFTER_S, compare=False)

    @classmethod
    def under(
        cls,
        data_root: Path,
        source_sha256: str,
        layout: str | None = None,
        keep_after_s: float = KEEP_AFTER_S,
    ) -> ConversionCache:
        layout = layout or default_layout()
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}")
        folder = Path(data_root) / "converted" / source_sha256[:32] / layout
        return cls(folder, source_sha256, layout, keep_after_s)

    def worth_keeping(self, seconds: float) -> bool:
        """Whether a conversion that took ``seconds`` is kept for the next load."""
        return seconds >= self.keep_after_s

    def load(self, config: dict[str, Any]) -> dict[str, mx.array] | None:
        """The kept weights, or None when there are none or they fail a check (then the
        entry is removed, so the caller converts again)."""
        if not self.folder.exists():
            return None
        try:
            meta = json.loads((self.folder / "meta.json").read_text(encoding="utf-8"))
            problem = self._problem(meta, config)
            if problem is None:
                weights = mx.load(str(self.folder / WEIGHTS_FILE))
                if len(weights) == meta["tensor_count"]:
                    return weights
                problem = f"{len(weights)} tensors instead of {meta['tensor_count']}"
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            problem = f"an unreadable entry ({exc})"
        log.warning("converted weights in %s: %s; converting again", self.folder, problem)
        shutil.rmtree(self.folder, ignore_errors=True)
        return None

    def _problem(self, meta: dict[str, Any], config: dict[str, Any]) -> str | None:
        if meta["format"] != CACHE_FORMAT or meta["layout"] != self.layout:
            return "an older format"
        if meta["source_sha256"] != self.source_sha256:
            return "another source file"
        stored_config = json.loads((self.folder / "config.json").read_text(encoding="utf-8"))
        if stored_config != json.loads(json.dumps(config)):
            return "another configuration"
        weights = self.folder / WEIGHTS_FILE
        remembered = FileDigest(
            meta["weights_sha256"], meta["weights_bytes"], meta["weights_mtime_ns"]
        )
        if weights.stat().st_size != remembered.size:
            return "a truncated weights file"
        digest = recheck(weights, remembered)  # touched since: the bytes are read again
        if digest.sha256 != remembered.sha256:
            return "a damaged weights file"
        if digest != remembered:
            try:  # remember the check; a read-only folder only costs it again next time
                self._write_meta({**meta, "weights_mtime_ns": digest.mtime_ns}, self.folder)
            except OSError:
                pass
        return None

    def save(self, config: dict[str, Any], weights: dict[str, mx.array]) -> None:
        """Keep ``weights``; a failure (disk full, read-only folder) only costs a later
        conversion, so it is logged, not raised."""
        tmp: Path | None = None
        try:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            self._remove_stale_temps()
            tmp = Path(tempfile.mkdtemp(prefix=f".{self.layout}.", dir=self.folder.parent))
            mx.save_safetensors(str(tmp / WEIGHTS_FILE), weights)
            (tmp / "config.json").write_text(
                json.dumps(config, indent=2, sort_keys=True), encoding="utf-8"
            )
            digest = recheck(tmp / WEIGHTS_FILE, None)
            meta = {
                "format": CACHE_FORMAT,
                "layout": self.layout,
                "source_sha256": self.source_sha256,
                "tensor_count": len(weights),
                "weights_bytes": digest.size,
                "weights_mtime_ns": digest.mtime_ns,
                "weights_sha256": digest.sha256,
            }
            self._write_meta(meta, tmp)
            self._move_into_place(tmp)
        except (OSError, RuntimeError) as exc:
            log.warning(
                "could not keep converted weights in %s (%s): the next load converts again",
                self.folder,
                exc,
            )
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def _move_into_place(self, tmp: Path) -> None:
        """``tmp`` becomes the entry, in one rename. An entry already there was kept by
        another process converting the same file at once (a bad or older one is removed by
        :meth:`load` before a conversion): the same bytes, possibly being read now, so it
        stays and ``tmp`` goes."""
        try:
            os.rename(tmp, self.folder)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not self.folder.is_dir():
                raise
            log.info("converted weights in %s were kept by another process meanwhile", self.folder)

    def _remove_stale_temps(self) -> None:
        """Temp folders a crashed conversion left (an hour old: no live one is that slow)."""
        for stale in self.folder.parent.glob(f".{self.layout}.*"):
            try:
                if time.time() - stale.stat().st_mtime > 3600:
                    shutil.rmtree(stale, ignore_errors=True)
            except OSError:
                pass

    @staticmethod
    def _write_meta(meta: dict[str, Any], folder: Path) -> None:
        tmp = folder / "meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=2), encoding="utf-8")
        tmp.replace(folder / "meta.json")
