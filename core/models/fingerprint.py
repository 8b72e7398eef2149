"""Fingerprints of loaded models.

Cached KV is reused only under the same fingerprint, so it covers everything that
changes the numbers: architecture and config, the bytes of every weight and tokenizer
file, the weight format the engine runs (quantized or dequantized to float32), and the
code that computes with them (the MLX and mlx-lm versions, ``NUMERICS_VERSION`` of
RadixChat's own model import and the GGUF conversion's format): K/V saved before an
upgrade that changes the numbers is recomputed, never reused.
Hashing a 10 GB model takes a while, so each file's SHA-256 is remembered by path,
size and modification time in a small JSON file in the data folder.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

from core.models.hashing import sha256_file

# Bump when a change to RadixChat's model import (GGUF conversion, model building)
# changes the numbers a model computes for the same files.
NUMERICS_VERSION = 1


class FileHashCache:
    """SHA-256 of files, remembered by (path, size, mtime_ns) in a JSON file."""

    def __init__(self, store: Path | None):
        self._store = store
        self._entries: dict[str, dict[str, Any]] = {}
        if store is not None and store.exists():
            try:
                self._entries = json.loads(store.read_text())
            except (OSError, ValueError):
                self._entries = {}  # a damaged cache costs a re-hash, nothing else

    def sha256(self, path: Path) -> str:
        path = path.resolve()
        stat = path.stat()
        entry = self._entries.get(str(path))
        if entry and entry.get("size") == stat.st_size and entry.get("mtime_ns") == stat.st_mtime_ns:
            return entry["sha256"]
        digest = sha256_file(path)
        self._entries[str(path)] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}
        self._save()
        return digest

    def _save(self) -> None:
        if self._store is None:
            return
        tmp = self._store.with_name(f"{self._store.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self._entries, indent=0, sort_keys=True))
            tmp.replace(self._store)
        except OSError:
            tmp.unlink(missing_ok=True)  # remembering is an optimisation only


def runtime_versions() -> dict[str, str]:
    """The versions of the code that computes with the weights."""
    import mlx.core as mx
    import mlx_lm

    from core.models.gguf_convert import CACHE_FORMAT  # bumped when the K-quant conversion changes

    return {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "radixchat_numerics": str(NUMERICS_VERSION),
            "gguf_conversion": str(CACHE_FORMAT)}


def model_fingerprint(
    config: dict[str, Any], files: Iterable[Path], weights_format: str, hashes: FileHashCache,
    runtime: dict[str, str] | None = None,
) -> str:
    """One hex digest naming a model exactly as the engine runs it."""
    description = {
        "config": config,
        "files": sorted((path.name, hashes.sha256(path)) for path in files),
        "weights_format": weights_format,
        "runtime": runtime if runtime is not None else runtime_versions(),
    }
    blob = json.dumps(description, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()
