"""The models downloaded into the Hugging Face cache: list them, delete one.

A downloaded model is a complete MLX repo (``org/name``) or a GGUF file in a repo
(``org/name:file.gguf``), as :mod:`core.models.hub.hf_cache` finds them. Deleting one removes
its files from the cache (blobs another file still links stay) and the KV cache saved
on disk under its fingerprints (:mod:`core.models.usage` knows them); other models'
cached KV stays.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from core.errors import UserError
from core.models import derived, usage
from core.models.hub import hf_cache
from core.models.hub.download import PARTIAL_SUFFIX
from core.paths import kv_cache_db_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InstalledModel:
    spec: str  # what the loader takes
    repo_id: str
    kind: str  # "mlx" | "gguf"
    path: Path  # snapshot folder or GGUF file
    size_bytes: int  # on disk (blobs counted once)
    last_used: float | None  # time.time() of the last load, None if never loaded


@dataclass(frozen=True)
class PartialDownload:
    repo_id: str
    bytes: int  # in blobs/*.incomplete: a pull resumes from them


@dataclass(frozen=True)
class Deleted:
    spec: str
    freed_bytes: int  # of model files
    kv_sessions: int  # cached sessions dropped
    kv_bytes: int
    derived_bytes: int = 0  # files made from it (core.models.derived)


def installed_models(data_root: Path) -> list[InstalledModel]:
    """Complete MLX repos and GGUF files in the HF cache, with size and last use."""
    uses = usage.read_uses(data_root)
    found = []
    for repo_id, snapshot in hf_cache.list_cached_repos():
        found.append(
            InstalledModel(
                repo_id,
                repo_id,
                "mlx",
                snapshot,
                _files_size(snapshot.iterdir()),
                _last_use(uses, snapshot),
            )
        )
    for spec, path in hf_cache.list_cached_ggufs():
        found.append(
            InstalledModel(
                spec,
                spec.partition(":")[0],
                "gguf",
                path,
                _files_size([path]),
                _last_use(uses, path),
            )
        )
    return found


def partial_downloads() -> list[PartialDownload]:
    """Repos with bytes of an unfinished pull."""
    partial = []
    root = hf_cache.hf_cache_root()
    try:
        folders = sorted(p for p in root.iterdir() if p.name.startswith("models--"))
    except OSError:
        return []
    for folder in folders:
        size = sum(
            p.stat().st_size
            for p in (folder / "blobs").glob(f"*{PARTIAL_SUFFIX}")
            if p.is_file() and not p.is_symlink()  # a link is not a part (a pull replaces it)
        )
        if size:
            partial.append(PartialDownload(folder.name[len("models--") :].replace("--", "/"), size))
    return partial


def find(data_root: Path, spec: str) -> InstalledModel | None:
    return next((m for m in installed_models(data_root) if m.spec == spec), None)


def delete_model(data_root: Path, spec: str) -> Deleted:
    """Delete a downloaded model (``org/name`` or ``org/name:file.gguf``, or a repo with
    only a partial download) and the KV cache saved under its fingerprints."""
    gguf = hf_cache.split_gguf_spec(spec)
    repo_id = gguf[0] if gguf else spec
    folder = hf_cache.repo_folder(repo_id)
    if folder is None or not folder.is_dir():
        raise UserError(f"no downloaded model {spec} (see `radixchat models`)")
    derived_freed = 0
    if gguf is None:
        uses = usage.uses_under(data_root, folder)
        freed = _tree_size(folder)
        shutil.rmtree(folder)
    else:
        pointers = [
            p for p in folder.glob(f"snapshots/*/{gguf[1]}") if p.is_file() or p.is_symlink()
        ]
        if not pointers:
            raise UserError(f"no downloaded model {spec} (see `radixchat models`)")
        uses = [u for p in pointers for u in usage.uses_under(data_root, p)]
        made_from = [f for p in pointers for f in derived.derived_of(data_root, p)]
        derived_freed = derived.remove(made_from)  # its tokenizer, kept conversions
        freed = _remove_files(folder, pointers)
        if not any(
            p.suffix.lower() in (".gguf", ".safetensors") for p in folder.glob("snapshots/*/**/*")
        ):
            freed += _tree_size(folder)
            shutil.rmtree(folder)  # nothing of a model is left in the repo
    fingerprints = {f for u in uses for f in u.fingerprints}
    sessions, kv_bytes = drop_cached_kv(data_root, fingerprints)
    usage.forget(data_root, [u.path for u in uses])
    return Deleted(spec, freed, sessions, kv_bytes, derived_freed)


def drop_cached_kv(data_root: Path, fingerprints: set[str]) -> tuple[int, int]:
    """Delete the sessions cached on disk under ``fingerprints`` (and the pages only they
    reach); returns (sessions, bytes freed)."""
    db = kv_cache_db_path(data_root)
    if not fingerprints or not db.exists():
        return 0, 0
    from kvcache.store import DiskStore, DiskStoreError

    sessions = freed = 0
    try:
        with DiskStore(db) as store:
            for info in store.sessions():
                if info.fingerprint in fingerprints:
                    freed += store.clear(info.name)
                    sessions += 1
    except DiskStoreError as exc:
        raise UserError(f"the model was deleted, but its cached KV could not be: {exc}") from None
    return sessions, freed


def _last_use(uses: dict[str, usage.ModelUse], path: Path) -> float | None:
    prefix = str(path)
    times = [u.last_used for p, u in uses.items() if p == prefix or p.startswith(prefix + "/")]
    if not times and path.parent.name == "snapshots":  # an MLX repo loaded at another revision
        repo = str(path.parent.parent)
        times = [
            u.last_used
            for p, u in uses.items()
            if p.startswith(repo + "/") and not p.endswith(".gguf")
        ]
    return max(times, default=None)


def _files_size(paths) -> int:
    seen, total = set(), 0
    for path in paths:
        try:
            real = Path(path).resolve()
            if real.is_file() and real not in seen:
                seen.add(real)
                total += real.stat().st_size
        except OSError:
            pass
    return total


def _tree_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _remove_files(folder: Path, pointers: list[Path]) -> int:
    """Remove snapshot links and the blobs no remaining link points to."""
    blobs = {p.resolve() for p in pointers}
    for pointer in pointers:
        pointer.unlink()
    still_linked = {p.resolve() for p in folder.glob("snapshots/**/*") if p.is_symlink()}
    freed = 0
    for blob in blobs - still_linked:
        if blob.is_file() and folder in blob.parents:
            freed += blob.stat().st_size
            blob.unlink()
    return freed
