"""Fingerprints of loaded models.

Cached KV is reused only under the same fingerprint, so it covers everything that
changes the numbers: architecture and config, the bytes of every weight and tokenizer
file, the weight format the engine runs (quantized or dequantized to float32), and the
code that computes with them (the MLX and mlx-lm versions, ``NUMERICS_VERSION`` of
RadixChat's own model import and the GGUF conversion's format): K/V saved before an
upgrade that changes the numbers is recomputed, never reused.
Hashing a 10 GB model takes a while, so each file's SHA-256 is remembered by path,
size and modification time (``core.models.hashing.FileHashCache``, in the data folder).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.models.hashing import FileHashCache

# Bump when a change to RadixChat's model import (GGUF conversion, model building)
# changes the numbers a model computes for the same files.
NUMERICS_VERSION = 1


def runtime_versions() -> dict[str, str]:
    """The versions of the code that computes with the weights."""
    import mlx.core as mx
    import mlx_lm

    # bumped when the K-quant conversion changes
    from core.models.load.gguf_convert import CACHE_FORMAT

    return {
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "radixchat_numerics": str(NUMERICS_VERSION),
        "gguf_conversion": str(CACHE_FORMAT),
    }


def model_fingerprint(
    config: dict[str, Any],
    files: Iterable[Path],
    weights_format: str,
    hashes: FileHashCache,
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
