"""The header of a GGUF file: metadata and tensor directory, no tensor data, no mlx.

One parser for every reader of a GGUF header: the importer (``core.models.load.gguf_import``)
and the conversion (``core.models.load.gguf_convert``) on the engine thread, and the model
picker's parameter counts (``core.models.catalog``), which must not import mlx.
Much faster than ``gguf.GGUFReader`` on a large vocabulary (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import mmap
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from core.errors import ModelLoadError

MLX_READS_EXACTLY = {T.F32, T.F16, T.Q4_0, T.Q4_1, T.Q8_0}  # what ``mx.load`` keeps as stored


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # NumPy order: rows first (GGUF lists dimensions innermost first)
    ggml_type: T
    offset: int  # absolute, in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    metadata: dict[str, Any]  # plain Python values: arrays as lists
    tensors: tuple[TensorInfo, ...]

    def mlx_reads_exactly(self) -> bool:
        return all(t.ggml_type in MLX_READS_EXACTLY for t in self.tensors)

    def parameter_count(self) -> int:
        """The number of weights in all tensors."""
        return sum(math.prod(t.shape) for t in self.tensors)


_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class _Reader:
    """Little-endian values from a buffer; running off its end raises ``struct.error``."""

    def __init__(self, buf) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def take(self, length: int) -> bytes:
        if self.pos + length > len(self.buf):
            raise struct.error("a value runs past the end of the file")
        self.pos += length
        return self.buf[self.pos - length : self.pos]  # a copy: no view of the mmap escapes

    def string(self) -> str:
        return self.take(self.scalar("<Q")).decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.scalar("<I"), self.scalar("<Q")
            if item_kind in _SCALARS:  # one NumPy read for the whole array
                dtype = np.dtype(_SCALARS[item_kind])
                return np.frombuffer(self.take(count * dtype.itemsize), dtype).tolist()
            return [self.value(item_kind) for _ in range(count)]
        if kind not in _SCALARS:
            raise ValueError(f"unknown metadata value type {kind}")
        return self.scalar(_SCALARS[kind])

    def skip(self, kind: int) -> None:
        """Step over a value without decoding it."""
        if kind == _STRING:
            self.take(self.scalar("<Q"))
        elif kind == _ARRAY:
            item_kind, count = self.scalar("<I"), self.scalar("<Q")
            if item_kind in _SCALARS:
                self.take(count * struct.calcsize(_SCALARS[item_kind]))
            else:
                for _ in range(count):
                    self.skip(item_kind)
        elif kind in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[kind])
        else:
            raise ValueError(f"unknown metadata value type {kind}")


def read_header(path: Path, metadata: bool | Collection[str] = True) -> GGUFHeader:
    """Metadata and tensor directory of a GGUF file (no tensor data is read).

    With ``metadata=False`` the values are stepped over, not decoded, and the header's
    metadata holds only ``general.alignment`` (where the file sets it): enough for the
    tensor directory, and faster on a large vocabulary (what the picker needs). With a
    collection of keys, those are decoded too (the picker's "has a chat template").

    Raises :class:`ModelLoadError` on a truncated, corrupt or non-GGUF file.
    """
    bad = f"{path.name} is not a readable GGUF file (truncated or corrupt?)"
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            size = len(buf)
            r = _Reader(buf)
            if bytes(buf[:4]) != b"GGUF":
                raise ModelLoadError(f"{bad}: no GGUF magic")
            r.pos = 4
            version = r.scalar("<I")
            if version == 1:  # 32-bit counts; long superseded by versions 2 and 3
                raise ModelLoadError(
                    f"{path.name}: GGUF version 1 is not supported: convert the model again"
                )
            n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
            values: dict[str, Any] = {}
            wanted = set() if isinstance(metadata, bool) else set(metadata)
            for _ in range(n_kv):
                key, kind = r.string(), r.scalar("<I")
                if metadata is True or key == "general.alignment" or key in wanted:
                    values[key] = r.value(kind)
                else:
                    r.skip(kind)
            raw_infos = []
            for _ in range(n_tensors):
                name = r.string()
                dims = [r.scalar("<Q") for _ in range(r.scalar("<I"))]
                raw_infos.append((name, tuple(reversed(dims)), r.scalar("<I"), r.scalar("<Q")))
            alignment = int(values.get("general.alignment", 32))
            data_start = -(-r.pos // alignment) * alignment
    except (OSError, ValueError, struct.error, OverflowError, MemoryError) as exc:
        raise ModelLoadError(f"{bad}: {exc}") from exc
    tensors = []
    for name, shape, type_id, offset in raw_infos:
        try:
            ggml_type = T(type_id)
            block_size, type_size = GGML_QUANT_SIZES[ggml_type]
        except (ValueError, KeyError):
            raise ModelLoadError(
                f"{path.name}: tensor {name} has an unknown GGML type {type_id}"
            ) from None
        nbytes = math.prod(shape) // block_size * type_size
        if data_start + offset + nbytes > size:
            raise ModelLoadError(f"{bad}: tensor {name} runs past the end of the file")
        tensors.append(TensorInfo(name, shape, ggml_type, data_start + offset, nbytes))
    return GGUFHeader(values, tuple(tensors))
