"""Files the data folder keeps about a model, made from it: derived files.

Loading a GGUF file leaves its tokenizer under ``<data>/tokenizers/<sha256[:32]>.json``
(seconds to rebuild from the metadata) and, when converting its weights took long, the
converted weights under ``<data>/converted/<sha256[:32]>/`` (``core.models.load.gguf_convert``:
a conversion that is quick happens at each load instead, with no copy on disk). Both are named
by the model file's SHA-256, so each belongs to the model file of that hash.

Here they are listed (by model, with their sizes; those of models no longer here apart),
measured (the engine counts them against the disk cache's budget) and removed (with their
model, or all at once: ``radixchat models clean``). Removing one only costs the next load the
time to make it again.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from core.models.hashing import FileHashCache

CONVERTED, TOKENIZER = "converted weights", "tokenizer"
CONVERTED_DIR, TOKENIZERS_DIR = "converted", "tokenizers"
KEY_CHARS = 32  # of the model file's SHA-256, naming its derived files


@dataclass(frozen=True)
class DerivedFile:
    """One derived file (or folder: converted weights) and the model file's hash prefix."""

    path: Path
    kind: str  # CONVERTED | TOKENIZER
    size_bytes: int
    key: str  # the first KEY_CHARS hex digits of the model file's SHA-256


def derived_files(data_root: Path) -> list[DerivedFile]:
    """Every derived file in the data folder, converted weights first."""
    root = Path(data_root)
    found = [
        DerivedFile(folder, CONVERTED, _size(folder), folder.name)
        for folder in _children(root / CONVERTED_DIR)
        if folder.is_dir() and not folder.name.startswith(".")
    ]
    found += [
        DerivedFile(file, TOKENIZER, _size(file), file.stem)
        for file in _children(root / TOKENIZERS_DIR)
        if file.suffix == ".json" and file.is_file()
    ]
    return found


def derived_bytes(data_root: Path) -> int:
    return sum(f.size_bytes for f in derived_files(data_root))


def key_of(data_root: Path, model_file: Path) -> str | None:
    """The key of ``model_file``'s derived files, if it was hashed here (a model never
    loaded has none); the file is not read."""
    sha = FileHashCache.in_data_folder(data_root).remembered(Path(model_file))
    return sha[:KEY_CHARS] if sha else None


def derived_of(data_root: Path, model_file: Path) -> list[DerivedFile]:
    """The derived files of one model file."""
    key = key_of(data_root, model_file)
    return [f for f in derived_files(data_root) if f.key == key] if key else []


def orphans(data_root: Path, model_files: Iterable[Path]) -> list[DerivedFile]:
    """Derived files whose model is not among ``model_files`` (deleted or moved away)."""
    keys = {key_of(data_root, path) for path in model_files} - {None}
    return [f for f in derived_files(data_root) if f.key not in keys]


def remove(files: Iterable[DerivedFile]) -> int:
    """Delete ``files``; the bytes freed (one already gone counts nothing)."""
    freed = 0
    for item in files:
        try:
            if item.path.is_dir():
                shutil.rmtree(item.path)
            else:
                item.path.unlink()
        except FileNotFoundError:
            continue
        freed += item.size_bytes
    return freed


def _children(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
