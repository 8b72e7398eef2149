"""The models found on this machine: the known models fetched into the data folder, the
other GGUF files and MLX folders there, and the complete MLX repos and GGUF files in the
local Hugging Face cache. What the picker and ``radixchat models`` list.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from core.models.hub import hf_cache
from core.models.pypi.known import KNOWN_MODELS
from core.models.pypi.provision import is_present

DATA_FOLDER_KINDS = ("known-gguf", "gguf", "mlx-dir")  # the data folder's own models


@dataclass(frozen=True)
class LocalModel:
    """A model found on this machine, as the model picker shows it."""

    name: str  # shown to the user
    spec: str  # what the loader accepts: a known name, a path, or a repo id
    kind: Literal["known-gguf", "gguf", "mlx-dir", "hf-cache", "hf-gguf"]
    size_bytes: int


def list_local_models(data_root: Path) -> list[LocalModel]:
    """Known models present, other GGUF files and MLX folders in ``<data>/models``, and
    complete MLX repos and GGUF files (``org/repo:file.gguf``) in the local Hugging Face cache."""
    folder = Path(data_root) / "models"
    found: list[LocalModel] = []
    known_files = {m.filename for m in KNOWN_MODELS.values()}
    for model in KNOWN_MODELS.values():
        if is_present(model, data_root):
            label = f"{model.filename.removesuffix('.gguf')} ({model.name})"
            found.append(LocalModel(label, model.name, "known-gguf", model.size))
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    for path in entries:
        if path.name.startswith("."):
            continue
        if path.suffix.lower() == ".gguf" and path.is_file() and path.name not in known_files:
            found.append(LocalModel(path.stem, str(path), "gguf", path.stat().st_size))
    for path in entries:
        if not path.name.startswith(".") and is_mlx_folder(path):
            found.append(LocalModel(path.name, str(path), "mlx-dir", folder_size(path)))
    for repo_id, snapshot in hf_cache.list_cached_repos():
        if is_mlx_folder(snapshot):
            found.append(LocalModel(repo_id, repo_id, "hf-cache", folder_size(snapshot)))
    for spec, path in hf_cache.list_cached_ggufs():
        found.append(LocalModel(spec, spec, "hf-gguf", path.stat().st_size))
    return found


def is_mlx_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def folder_size(path: Path) -> int:
    """Total bytes of the files in a folder, following links (HF snapshots link to blobs)."""
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):  # a file that went meanwhile, a broken link: 0 bytes
            if p.is_file():
                total += p.stat().st_size
    return total


def model_file(data_root: Path, model: LocalModel) -> Path | None:
    """The GGUF file of a listed model (the one its derived files are made from); None for an
    MLX folder."""
    if model.kind == "known-gguf":
        return Path(data_root) / "models" / KNOWN_MODELS[model.spec].filename
    if model.kind == "gguf":
        return Path(model.spec)
    if model.kind == "hf-gguf":
        return hf_cache.resolve_gguf(model.spec)
    return None


def model_path(data_root: Path, model: LocalModel) -> Path | None:
    """The file or folder of a listed model (None for an HF cache repo no longer complete)."""
    if model.kind == "mlx-dir":
        return Path(model.spec)
    if model.kind == "hf-cache":
        return hf_cache.resolve_repo(model.spec)
    return model_file(data_root, model)


def find_in_data_folder(data_root: Path, name: str) -> LocalModel | None:
    """The data folder's model that ``radixchat models`` lists as ``name`` (a known model's
    name, another model's path); None when there is none."""
    wanted = Path(name).expanduser()
    for model in list_local_models(data_root):
        if model.kind not in DATA_FOLDER_KINDS:
            continue
        if model.spec == name or (model.kind != "known-gguf" and _same(Path(model.spec), wanted)):
            return model
    return None


def _same(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        return a.resolve() == b.resolve()
    return False
