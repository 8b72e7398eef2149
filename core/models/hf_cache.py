"""The local Hugging Face hub cache, read by hand (no network, no ``huggingface_hub``).

The documented layout is::

    <root>/models--{org}--{name}/refs/main            (a commit hash)
    <root>/models--{org}--{name}/snapshots/<rev>/...  (files, usually links to ../../blobs)

where ``<root>`` is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.
"""

from __future__ import annotations

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


def resolve_repo(repo_id: str) -> Path | None:
    """The cached snapshot folder of ``repo_id`` if it holds a ``config.json``, else None."""
    folder = _repo_folder(repo_id)
    if folder is None or not folder.is_dir():
        return None
    snapshot = _snapshot(folder)
    if snapshot is None or not (snapshot / "config.json").is_file():
        return None
    return snapshot


def list_cached_repos() -> list[tuple[str, Path]]:
    """Every cached model repo with a ``config.json``, as ``(repo_id, snapshot folder)``, sorted."""
    root = hf_cache_root()
    try:
        folders = sorted(p for p in root.iterdir() if p.name.startswith(_MODEL_PREFIX) and p.is_dir())
    except OSError:
        return []
    repos = []
    for folder in folders:
        repo_id = folder.name[len(_MODEL_PREFIX):].replace("--", "/")
        snapshot = resolve_repo(repo_id)
        if snapshot is not None:
            repos.append((repo_id, snapshot))
    return repos
