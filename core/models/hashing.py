"""SHA-256 of files: one reader, for the fingerprint and the GGUF conversion cache alike.

Plain file reads only (no mlx): both ``core.models.fingerprint`` and
``core.models.gguf_convert`` import it, so neither imports the other for it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 4 << 20


def sha256_file(path: Path) -> str:
    """The file's SHA-256 (hex), read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()
