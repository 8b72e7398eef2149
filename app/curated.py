"""The curated chat models of the picker's Download tab (``resources/curated_models.json``):
a short list of good models per memory size, each with its fits badge for this machine, so
a newcomer has somewhere to start before searching. Read from the file: no network call."""

from __future__ import annotations

import json
from dataclasses import dataclass

from core.models.hub.fit import estimate_fit
from core.models.hub.search import SearchResult
from resources import resource_path

CURATED_FILE = "curated_models.json"


@dataclass(frozen=True)
class CuratedModel:
    """One model of the list: a hub search result as if found (its fit computed here), the
    GGUF file to download (None for an MLX repo), the machine memory it suits, a note."""

    result: SearchResult
    file: str | None
    memory_gb: int
    note: str

    @property
    def target(self) -> str:
        """What a pull takes: ``REPO`` or ``REPO:FILE``."""
        repo = self.result.repo_id
        return f"{repo}:{self.file}" if self.file else repo


def curated_models(on_cpu: bool, machine_bytes: int | None = None) -> list[CuratedModel]:
    """The list, smallest memory first, each model's fit for this machine."""
    data = json.loads(resource_path(CURATED_FILE).read_text(encoding="utf-8"))
    models = []
    for tier in data["tiers"]:
        for entry in tier["models"]:
            fit = estimate_fit(
                entry["kind"], entry["size_bytes"], entry["parameters"], on_cpu, machine_bytes
            )
            result = SearchResult(
                repo_id=entry["repo_id"],
                kind=entry["kind"],
                downloads=0,
                parameters=entry["parameters"],
                quantization=entry["quantization"],
                size_bytes=entry["size_bytes"],
                fit=fit,
            )
            models.append(CuratedModel(result, entry.get("file"), tier["memory_gb"], entry["note"]))
    return models
