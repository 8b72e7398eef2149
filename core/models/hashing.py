"""SHA-256 of files, and the one rule for remembering it: by path, size and mtime.

Hashing a 10 GB model takes a while, so a file's hash is read once and then
remembered with the file's size and modification time (nanoseconds); a file whose
size or mtime changed is read again, whatever the remembered record says. Every hash
RadixChat keeps follows this rule through :func:`recheck`: the model files behind a
fingerprint and the known models' downloads (both in :class:`FileHashCache`, one JSON
file in the data folder) and a converted GGUF's weights file (its ``meta.json``).

Plain file reads only (no mlx): the picker and the provisioning code use it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CHUNK = 4 << 20
HASHES_FILE = "file_hashes.json"  # in the data folder

OnFraction = Callable[[float | None], None]


def sha256_file(path: Path, on_fraction: OnFraction | None = None) -> str:
    """The file's SHA-256 (hex), read in 4 MiB blocks; ``on_fraction`` hears the share
    read after each block (None for an empty file)."""
    digest, done = hashlib.sha256(), 0
    total = os.stat(path).st_size if on_fraction else 0
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
            if on_fraction:
                done += len(block)
                on_fraction(done / total if total else None)
    return digest.hexdigest()


@dataclass(frozen=True)
class FileDigest:
    """A file's SHA-256 as it was when the file had this size and mtime."""

    sha256: str
    size: int
    mtime_ns: int

    def still_matches(self, st: os.stat_result) -> bool:
        """True while the file keeps the size and mtime it had when it was hashed."""
        return self.size == st.st_size and self.mtime_ns == st.st_mtime_ns

    @classmethod
    def of(cls, path: Path, sha256: str, st: os.stat_result | None = None) -> FileDigest:
        """Remember ``sha256`` (known from elsewhere) for the file as it is now."""
        st = st or os.stat(path)
        return cls(sha256, st.st_size, st.st_mtime_ns)

    @classmethod
    def from_json(cls, record: Any) -> FileDigest | None:
        """A record written by :meth:`to_json`, or None when it is not one."""
        try:
            return cls(str(record["sha256"]), int(record["size"]), int(record["mtime_ns"]))
        except (KeyError, TypeError, ValueError):
            return None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def recheck(
    path: Path, remembered: FileDigest | None, on_fraction: OnFraction | None = None
) -> FileDigest:
    """``remembered`` while the file keeps its size and mtime, else a fresh digest.

    The file is statted before it is read, so a write during the read leaves a record
    that no longer matches, and the next call reads the file again.
    """
    st = os.stat(path)
    if remembered is not None and remembered.still_matches(st):
        return remembered
    return FileDigest(sha256_file(path, on_fraction), st.st_size, st.st_mtime_ns)


class FileHashCache:
    """SHA-256 of files by resolved path, remembered in a JSON file (or only in memory
    when ``store`` is None). A damaged or unwritable store costs a re-hash, nothing else.

    Safe to share between threads; two processes sharing a store may each drop the
    other's newest entries (the last writer wins), which again only costs a re-hash.
    """

    def __init__(self, store: Path | None):
        self._store = store
        self._entries: dict[str, Any] = {}
        self._lock = threading.Lock()
        if store is not None and store.exists():
            try:
                loaded = json.loads(store.read_text(encoding="utf-8"))
                self._entries = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                self._entries = {}

    @classmethod
    def in_data_folder(cls, data_root: Path) -> FileHashCache:
        """The data folder's cache, shared by the loader and provisioning."""
        return cls(Path(data_root) / HASHES_FILE)

    def sha256(self, path: Path, on_fraction: OnFraction | None = None) -> str:
        """The file's SHA-256, read only when the file is new here or its size or mtime changed."""
        key = str(Path(path).resolve())
        with self._lock:
            remembered = FileDigest.from_json(self._entries.get(key))
        digest = recheck(Path(key), remembered, on_fraction)
        if digest != remembered:
            self._put(key, digest)
        return digest.sha256

    def remembered(self, path: Path) -> str | None:
        """The file's SHA-256 if it was hashed here and has not changed since, without
        reading it (None otherwise)."""
        key = str(Path(path).resolve())
        with self._lock:
            remembered = FileDigest.from_json(self._entries.get(key))
        try:
            st = os.stat(key)
        except OSError:
            return None
        if remembered is None or not remembered.still_matches(st):
            return None
        return remembered.sha256

    def remember(self, path: Path, sha256: str) -> None:
        """Record a hash known from elsewhere (a download checked while it was written)."""
        key = str(Path(path).resolve())
        self._put(key, FileDigest.of(Path(key), sha256))

    def _put(self, key: str, digest: FileDigest) -> None:
        with self._lock:
            self._entries[key] = digest.to_json()
            self._save()

    def _save(self) -> None:
        if self._store is None:
            return
        tmp = self._store.with_name(f"{self._store.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps(self._entries, indent=0, sort_keys=True), encoding="utf-8")
            tmp.replace(self._store)
        except OSError:
            tmp.unlink(missing_ok=True)  # remembering is an optimisation only
