"""The models the picker offers, with the memory each will take once loaded, and whether
each is a base model (completion only: ``core.models.base_models``).

Plain file reads only (no mlx): the GUI builds its model list from here. The memory
figure is for the weights. On the CPU backend the loader dequantizes every model to
float32, so it is four bytes per parameter; the parameter count comes from the GGUF
header or the safetensors headers (a few reads, no weights touched). Where MLX runs on
the GPU (Metal) the weights stay as stored, so it is about the file size.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import UserError
from core.models.base_models import GGUF_KEYS, gguf_metadata_is_base, is_base_model, named_base
from core.models.hub import hf_cache

if TYPE_CHECKING:  # imported where they are used: the hub's fit estimate needs neither
    from core.models.local import LocalModel

GGUF_BITS_PER_WEIGHT = 4.5  # a typical 4-bit quant with its scales, when the header is unreadable
FLOAT32_BYTES = 4
# Parameter counts of the known models' files, read from their headers, by SHA-256: exact
# figures before the download (a new version of a file has a new hash and is estimated).
KNOWN_PARAMETERS = {
    # SmolLM2-135M Q4_1
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53": 134_515_008,
    # Gemma 3 270M Q4_K_M
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818": 268_098_176,
    # Qwen2.5-Coder-0.5B-Instruct (its output matrix apart from the embeddings)
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32": 630_167_424,
}


@dataclass(frozen=True)
class CatalogEntry:
    """One model the picker can offer."""

    spec: str  # what the loader accepts: a known name, a path, or a repo id
    name: str
    # core.models.local.LocalModel kinds: "known-gguf" | "gguf" | "mlx-dir" | "hf-cache" | "hf-gguf"
    kind: str
    size_bytes: int  # on disk (for a known model not yet downloaded: what it will be)
    memory_bytes: int  # estimated memory of the loaded weights
    downloaded: bool = True  # False: a known model that is fetched on first use
    description: str = ""
    base: bool = False  # a base model: completion only (core.models.base_models)


def runs_on_cpu() -> bool:
    """Whether the loader will dequantize to float32: MLX's CPU backend, i.e. not macOS.

    (A Linux machine with MLX's CUDA backend keeps the stored weights; telling the two
    apart needs mlx, so the estimate errs high there.)"""
    return sys.platform != "darwin"


def estimate_memory_bytes(
    kind: str, size_bytes: int, on_cpu: bool, parameters: int | None = None
) -> int:
    """The memory a model's weights take once loaded.

    On the CPU every weight becomes float32: ``4 * parameters`` when the count is known,
    else ``size * 32 / 4.5`` for a GGUF file (a 4-bit quant) and the file size for an MLX
    folder. Elsewhere the weights stay as stored: about the size on disk."""
    if not on_cpu:
        return size_bytes
    if parameters:
        return FLOAT32_BYTES * parameters
    if kind in ("gguf", "known-gguf", "hf-gguf"):
        return int(size_bytes * 32 / GGUF_BITS_PER_WEIGHT)
    return size_bytes


def model_catalog(data_root: Path, on_cpu: bool | None = None) -> list[CatalogEntry]:
    """The known models first (``default`` first), downloaded or not, then the local ones
    (GGUF files and MLX folders in ``<data>/models``, MLX repos in the HF cache)."""
    from core.models.local import list_local_models
    from core.models.pypi.known import KNOWN_MODELS
    from core.models.pypi.provision import known_model_path

    on_cpu = runs_on_cpu() if on_cpu is None else on_cpu
    local = list_local_models(data_root)
    present = {m.spec for m in local if m.kind == "known-gguf"}
    entries = []
    for known in KNOWN_MODELS.values():
        downloaded = known.name in present
        path = known_model_path(known, data_root)
        facts = _gguf_facts_of(path) if downloaded else None
        parameters = facts.parameters if facts else KNOWN_PARAMETERS.get(known.sha256)
        entries.append(
            CatalogEntry(
                spec=known.name,
                name=f"{known.filename.removesuffix('.gguf')} ({known.name})",
                kind="known-gguf",
                size_bytes=known.size,
                memory_bytes=estimate_memory_bytes("known-gguf", known.size, on_cpu, parameters),
                downloaded=downloaded,
                description=known.description,
                base=facts.base if facts else known.base,
            )
        )
    for model in local:
        if model.kind != "known-gguf":
            entries.append(_entry(model, on_cpu))
    return entries


def describe_spec(spec: str, data_root: Path) -> str:
    """``spec`` for a status line: its name and the memory its weights will take."""
    try:
        entry = next((e for e in model_catalog(data_root) if e.spec == spec), None)
        if entry is None and Path(spec).exists():
            entry = entry_for_path(Path(spec))
    except (UserError, OSError):
        entry = None
    if entry is None:
        return spec
    return f"{entry.name} (about {entry.memory_bytes / 2**20:,.0f} MB in memory)"


def entry_for_path(path: Path, on_cpu: bool | None = None) -> CatalogEntry:
    """A catalog entry for a file or folder the user picked; :class:`UserError` if it is
    neither a ``.gguf`` file nor an MLX model folder."""
    from core.models.local import LocalModel, folder_size, is_mlx_folder

    on_cpu = runs_on_cpu() if on_cpu is None else on_cpu
    path = Path(path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _entry(LocalModel(path.stem, str(path), "gguf", path.stat().st_size), on_cpu)
    if is_mlx_folder(path):
        return _entry(LocalModel(path.name, str(path), "mlx-dir", folder_size(path)), on_cpu)
    if path.is_dir():
        raise UserError(
            f"{path} is not an MLX model folder: it needs config.json and .safetensors weights"
        )
    raise UserError(f"{path} is not a .gguf file")


def _entry(model: LocalModel, on_cpu: bool) -> CatalogEntry:
    if model.kind in ("gguf", "hf-gguf"):
        path = Path(model.spec) if model.kind == "gguf" else hf_cache.resolve_gguf(model.spec)
        facts = _gguf_facts_of(path) if path is not None else None
        parameters = facts.parameters if facts else None
        base = bool(facts and facts.base) or named_base(model.name)
    else:
        folder = Path(model.spec) if model.kind == "mlx-dir" else hf_cache.resolve_repo(model.spec)
        parameters = safetensors_parameter_count(folder) if folder is not None else None
        base = folder is not None and is_base_model(folder, model.name)
    return CatalogEntry(
        spec=model.spec,
        name=model.name,
        kind=model.kind,
        size_bytes=model.size_bytes,
        memory_bytes=estimate_memory_bytes(model.kind, model.size_bytes, on_cpu, parameters),
        base=base,
    )


# ---------------------------------------------------------------------------- parameter counts


@dataclass(frozen=True)
class GGUFFacts:
    """What the picker reads of a GGUF header: one read for both."""

    parameters: int | None  # None if the file has no tensors
    base: bool  # no chat template, or named a base model


def gguf_parameter_count(path: Path) -> int | None:
    """The number of weights in a GGUF file, from its header; None if unreadable or empty."""
    facts = _gguf_facts_of(path)
    return facts.parameters if facts else None


def _gguf_facts_of(path: Path) -> GGUFFacts | None:
    """None if the file cannot be read."""
    try:
        st = Path(path).stat()
        return _gguf_facts(str(path), st.st_size, st.st_mtime_ns)
    except (OSError, UserError):
        return None


@lru_cache(maxsize=64)
def _gguf_facts(path: str, size: int, mtime_ns: int) -> GGUFFacts:
    """(size and mtime are the cache key: a changed file is read again)"""
    # numpy and gguf: not for `radixchat pull` / search
    from core.models.load.gguf_header import read_header

    header = read_header(Path(path), metadata=GGUF_KEYS)
    return GGUFFacts(header.parameter_count() or None, gguf_metadata_is_base(header.metadata))


def safetensors_parameter_count(folder: Path) -> int | None:
    """The number of weights in an MLX folder once dequantized, from the safetensors
    headers and ``config.json``'s ``quantization``; None if unreadable.

    An MLX-quantized matrix is stored as uint32 words of ``bits``-bit values with
    ``.scales`` and ``.biases`` beside it, which dequantizing folds into the weights."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        tensors: dict[str, dict] = {}
        for file in sorted(Path(folder).glob("*.safetensors")):
            tensors.update(_safetensors_header(file))
    except (OSError, ValueError, struct.error):
        return None
    quantization = config.get("quantization") or config.get("quantization_config") or {}
    total = 0
    for name, info in tensors.items():
        base = name.rsplit(".", 1)[0]
        count = math.prod(info.get("shape", []))
        if name.endswith((".scales", ".biases")) and base + ".weight" in tensors:
            continue
        if info.get("dtype") == "U32" and base + ".scales" in tensors:
            layer = quantization.get(base)
            bits = (layer if isinstance(layer, dict) else quantization).get("bits", 4)
            count = count * 32 // bits
        total += count
    return total


def _safetensors_header(file: Path) -> dict[str, dict]:
    with file.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > 100 * 2**20:
            raise ValueError(f"{file} has an implausible header")
        header = json.loads(f.read(length))
    if not isinstance(header, dict):
        raise ValueError(f"{file} has no tensor table")
    header.pop("__metadata__", None)
    return header
