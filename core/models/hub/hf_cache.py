"""The local Hugging Face hub cache, read by hand (no network, no ``huggingface_hub``).

The documented layout is::

    <root>/models--{org}--{name}/refs/main            (a commit hash)
    <root>/models--{org}--{name}/snapshots/<rev>/...  (files, usually links to ../../blobs)

where ``<root>`` is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.

Only complete models are offered: an MLX snapshot needs ``config.json`` and every weight
file its ``model.safetensors.index.json`` names (or one ``.safetensors`` file without an
index); a GGUF file in a snapshot is named ``org/repo:file.gguf``. A download in progress
keeps its bytes in ``blobs/*.incomplete`` and links a snapshot file only once it is whole
and verified (core.models.hub.download), so nothing half-downloaded shows here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

_MODEL_PREFIX = "models--"


def hf_cache_root() -> Path:
    """Where the hub cache lives (whether it exists or not)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(cache).expanduser() / "huggingface" / "hub"


def _repo_folder(repo_id: str) -> Path | None:
    parts = repo_id.split("/")
    if not 1 <= len(parts) <= 2 or not all(p and p not in (".", "..") for p in parts):
        return None
    if any("\\" in p or ":" in p for p in parts):
        return None
    return hf_cache_root() / (_MODEL_PREFIX + "--".join(parts))


def _snapshot(folder: Path) -> Path | None:
    """The snapshot that ``refs/main`` names, else the most recently written one."""
    snapshots = folder / "snapshots"
    try:
        main = (folder / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        main = ""
    if main and "/" not in main and (snapshots / main).is_dir():
        return snapshots / main
    try:
        candidates = [p for p in snapshots.iterdir() if p.is_dir()]
    except OSError:
        return None
    return max(candidates, key=lambda p: p.stat().st_mtime, default=None)


def repo_folder(repo_id: str) -> Path | None:
    """``<root>/models--{org}--{name}`` for a well-formed repo id (existing or not), else None."""
    return _repo_folder(repo_id)


def snapshot_complete(snapshot: Path) -> bool:
    """Whether an MLX snapshot has its config and every weight file (links resolve)."""
    if not (snapshot / "config.json").is_file():
        return False
    index = snapshot / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False
        return bool(shards) and all((snapshot / shard).is_file() for shard in shards)
    return any(p.is_file() for p in snapshot.glob("*.safetensors"))


def resolve_repo(repo_id: str) -> Path | None:
    """The cached snapshot folder of ``repo_id`` if it holds a complete model (a
    ``config.json`` and its weights), else None."""
    folder = _repo_folder(repo_id)
    if folder is None or not folder.is_dir():
        return None
    snapshot = _snapshot(folder)
    if snapshot is None or not snapshot_complete(snapshot):
        return None
    return snapshot


def split_gguf_spec(spec: str) -> tuple[str, str] | None:
    """``("org/repo", "file.gguf")`` for a spec ``org/repo:file.gguf``, else None."""
    repo_id, sep, filename = spec.partition(":")
    if not sep or not filename.lower().endswith(".gguf") or _repo_folder(repo_id) is None:
        return None
    if filename.startswith("/") or ".." in filename.split("/"):
        return None
    return repo_id, filename


def resolve_gguf(spec: str) -> Path | None:
    """The cached file a spec ``org/repo:file.gguf`` names, if it is there whole, else None."""
    parts = split_gguf_spec(spec)
    folder = _repo_folder(parts[0]) if parts else None
    if parts is None or folder is None or not folder.is_dir():
        return None
    snapshot = _snapshot(folder)
    path = snapshot / parts[1] if snapshot is not None else None
    return path if path is not None and path.is_file() else None


def list_cached_ggufs() -> list[tuple[str, Path]]:
    """Every GGUF file in a cached model repo's snapshot, as ``("org/repo:file.gguf", path)``."""
    found = []
    for repo_id, folder in _repo_folders():
        snapshot = _snapshot(folder)
        if snapshot is None:
            continue
        for path in sorted(snapshot.rglob("*.gguf")):
            if path.is_file():
                found.append((f"{repo_id}:{path.relative_to(snapshot).as_posix()}", path))
    return found


def _repo_folders() -> list[tuple[str, Path]]:
    try:
        folders = sorted(
            p for p in hf_cache_root().iterdir() if p.name.startswith(_MODEL_PREFIX) and p.is_dir()
        )
    except OSError:
        return []
    return [(folder.name[len(_MODEL_PREFIX) :].replace("--", "/"), folder) for folder in folders]


def list_cached_repos() -> list[tuple[str, Path]]:
    """Every cached model repo with a complete MLX model, as ``(repo_id, snapshot folder)``,
    sorted."""
    repos = []
    for repo_id, _folder in _repo_folders():
        snapshot = resolve_repo(repo_id)
        if snapshot is not None:
            repos.append((repo_id, snapshot))
    return repos


def repo_of_snapshot(path: Path) -> str | None:
    """The ``org/name`` of a snapshot folder of the HF cache (``models--org--name/snapshots/
    <commit>``), else None: a hub model is called by its repo, not its commit."""
    parent = path.parent
    if parent.name != "snapshots" or not parent.parent.name.startswith(_MODEL_PREFIX):
        return None
    return parent.parent.name[len(_MODEL_PREFIX) :].replace("--", "/")
