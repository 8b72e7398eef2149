"""The models on this machine as Ollama names and describes them: ``/api/tags``, ``/api/show``
and ``/api/ps`` bodies, and a client's ``name:tag`` resolved to a local model.

Names. Ollama names a model ``name:tag``; each local model gets one:

- a GGUF file (a known model's or one in the models folder): its file name, the
  quantization as the tag (``SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``smollm2-135m-instruct:q4_1``);
- an MLX folder in the models folder: its name, ``:latest``;
- a model downloaded from the hub: ``hf.co/ORG/REPO:latest`` (MLX) or
  ``hf.co/ORG/REPO:QUANT`` (a GGUF file, tagged with its quantization, else its file name),
  the name Ollama gives Hugging Face models;
- the loaded model, when it is none of these (a folder elsewhere): its id, ``:latest``.

A client's name is matched without regard to case, with ``:latest`` or without, with or
without ``hf.co/``, and as RadixChat's own spec (``default``, ``gemma3-270m``,
``ORG/REPO:file.gguf``). Any name that matches none is served by the loaded model, as in
the other dialects.

Digests: a known model's SHA-256 and a hub GGUF's blob name are its file's hash; a hub MLX
repo's is the hash of its files' blob names; another local model's is the hash of its path,
size and modification time (an identity, not the content's hash: a 10 GB file is not read
for a listing).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.api.ollama_reply import timestamp
from core.errors import UserError
from core.models.catalog import runs_on_cpu
from core.models.describe import ModelDescription, describe_model
from core.models.hub import hf_cache
from core.models.hub.client import quantization_of
from core.models.local import LocalModel, folder_size, list_local_models, model_file
from core.models.pypi.known import KNOWN_MODELS

if TYPE_CHECKING:
    from core.engine.engine_stats import EngineStats
    from core.engine.template_facts import TemplateFacts
    from core.models.load.loader import ModelInfo

HUB_HOSTS = ("hf.co/", "huggingface.co/")
HUB_PREFIXES = (*HUB_HOSTS, "registry.ollama.ai/library/", "library/")
LATEST = "latest"
KEPT_FOR_S = 100 * 365 * 24 * 3600  # /api/ps: a loaded model stays while the server runs
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME_CHARS = re.compile(r"[^a-z0-9._-]+")


@dataclass(frozen=True)
class OllamaModel:
    """A local model under its Ollama name."""

    name: str
    spec: str  # what the loader takes
    kind: str  # core.models.local's kinds, or "loaded" (the loaded model, found nowhere else)
    path: Path | None
    size: int
    modified_at: float
    digest: str
    description: ModelDescription | None
    aliases: frozenset[str]  # normalized names that find it

    def details(self) -> dict[str, Any]:
        d = self.description
        family = d.architecture if d is not None else ""
        return {
            "parent_model": "",
            "format": d.format if d is not None else "",
            "family": family,
            "families": [family] if family else None,
            "parameter_size": parameter_size(d.parameter_count if d is not None else None),
            "quantization_level": d.quantization if d is not None else "",
        }

    def listed(self) -> dict[str, Any]:
        """The model as ``/api/tags`` lists it."""
        return {
            "name": self.name,
            "model": self.name,
            "modified_at": timestamp(self.modified_at),
            "size": self.size,
            "digest": self.digest,
            "details": self.details(),
        }


def normalize(name: str) -> str:
    """A name as names are compared: lower case, no hub host."""
    name = name.strip().lower()
    for prefix in HUB_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def parameter_size(count: int | None) -> str:
    """135_000_000 -> "135.0M", as Ollama writes parameter sizes."""
    if not count:
        return ""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return str(count)


def _from_file_name(stem: str) -> str:
    """``SmolLM2-135M-Instruct.Q4_1`` -> ``smollm2-135m-instruct:q4_1``."""
    quant = quantization_of(stem)
    base = stem
    if quant:
        at = stem.upper().rfind(quant)
        if at > 0:
            base = stem[:at].rstrip("-._ ")
    base = _NAME_CHARS.sub("-", base.lower()).strip("-") or "model"
    return f"{base}:{quant.lower() if quant else LATEST}"


def _name(model: LocalModel, path: Path | None) -> str:
    if model.kind == "known-gguf":
        return _from_file_name(KNOWN_MODELS[model.spec].filename.removesuffix(".gguf"))
    if model.kind == "gguf":
        return _from_file_name(Path(model.spec).stem)
    if model.kind == "mlx-dir":
        return f"{_NAME_CHARS.sub('-', Path(model.spec).name.lower()).strip('-')}:{LATEST}"
    repo, _, file = model.spec.partition(":")
    if model.kind == "hf-gguf":
        tag = quantization_of(file) or Path(file).stem
        return f"hf.co/{repo}:{tag}"
    return f"hf.co/{repo}:{LATEST}"


def _aliases(name: str, spec: str) -> frozenset[str]:
    found = {normalize(name), normalize(spec), normalize(f"{spec}:{LATEST}")}
    if name.endswith(f":{LATEST}"):
        found.add(normalize(name.removesuffix(f":{LATEST}")))
    return frozenset(found)


def _digest(model: LocalModel, path: Path | None) -> str:
    if model.kind == "known-gguf":
        return KNOWN_MODELS[model.spec].sha256
    if path is not None and model.kind == "hf-gguf":
        blob = path.resolve().name
        if _HEX64.match(blob):
            return blob
    if path is not None and model.kind == "hf-cache":
        files = sorted(
            f"{p.relative_to(path).as_posix()} {p.resolve().name}"
            for p in path.rglob("*")
            if p.is_file()
        )
        return hashlib.sha256("\n".join(files).encode()).hexdigest()
    return identity_digest(path)


def identity_digest(path: Path | None) -> str:
    """The hash of a path, its size and modification time (not of its bytes)."""
    try:
        stat = path.stat() if path is not None else None
    except OSError:
        stat = None
    key = f"{path}\0{stat.st_size if stat else 0}\0{stat.st_mtime_ns if stat else 0}"
    return hashlib.sha256(key.encode()).hexdigest()


def _path(data_root: Path, model: LocalModel) -> Path | None:
    if model.kind in ("mlx-dir", "gguf"):
        return Path(model.spec)
    if model.kind == "hf-cache":
        return hf_cache.resolve_repo(model.spec)
    return model_file(data_root, model)


def _describe(path: Path | None) -> ModelDescription | None:
    if path is None:
        return None
    try:
        return describe_model(path)
    except (UserError, OSError, ValueError):
        return None


def _size_on_disk(path: Path, otherwise: int) -> int:
    """A model's bytes on disk, as Ollama's listing gives them (a file's size, a folder's
    files); ``otherwise`` where the path can't be read."""
    try:
        return path.stat().st_size if path.is_file() else folder_size(path)
    except OSError:
        return otherwise


def _modified(path: Path | None) -> float:
    try:
        return path.stat().st_mtime if path is not None else time.time()
    except OSError:
        return time.time()


def local_models(
    data_root: Path, info: ModelInfo | None = None, model_id: str = ""
) -> list[OllamaModel]:
    """Every local model under its Ollama name (the loaded one first); plain file reads,
    so call it off the event loop. ``model_id``: the loaded model's id (``--alias``...)."""
    found: list[OllamaModel] = []
    names: set[str] = set()
    for model in list_local_models(data_root):
        path = _path(data_root, model)
        name = _unique(_name(model, path), names)
        found.append(
            OllamaModel(
                name,
                model.spec,
                model.kind,
                path,
                model.size_bytes,
                _modified(path),
                _digest(model, path),
                _describe(path),
                _aliases(name, model.spec),
            )
        )
    if info is not None:
        loaded = loaded_among(found, info)
        if loaded is None:
            path = Path(info.path)
            name = _unique(
                f"{_NAME_CHARS.sub('-', (model_id or info.name).lower()).strip('-')}:{LATEST}",
                names,
            )
            loaded = OllamaModel(
                name,
                info.spec,
                "loaded",
                path,
                _size_on_disk(path, info.weight_bytes),
                _modified(path),
                identity_digest(path),
                _describe(path),
                _aliases(name, info.spec) | {normalize(model_id), normalize(info.name)},
            )
            found.append(loaded)
        found.remove(loaded)
        found.insert(0, loaded)
    return found


def _unique(name: str, taken: set[str]) -> str:
    base, _, tag = name.rpartition(":")
    candidate, n = name, 2
    while normalize(candidate) in taken:
        candidate, n = f"{base}:{tag}-{n}", n + 1
    taken.add(normalize(candidate))
    return candidate


def loaded_among(models: list[OllamaModel], info: ModelInfo) -> OllamaModel | None:
    """The listed model that is the loaded one (by its file or folder)."""
    target = _resolved(Path(info.path))
    return next((m for m in models if m.path is not None and _resolved(m.path) == target), None)


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path


def find(models: list[OllamaModel], name: str) -> OllamaModel | None:
    """The model a client's name means, or None."""
    wanted = normalize(name)
    return next((m for m in models if wanted in m.aliases), None)


# ------------------------------------------------------------------ bodies
def capabilities(takes_tools: bool, reasons: bool) -> list[str]:
    return ["completion", *(["tools"] if takes_tools else []), *(["thinking"] if reasons else [])]


def parameters_text(stop_words: tuple[str, ...], context_length: int | None) -> str:
    """``/api/show``'s ``parameters``: one ``key value`` a line, values that are strings in
    JSON quotes (as Ollama writes them, and Continue reads them)."""
    lines = [f"{'stop':<30} {json.dumps(word)}" for word in stop_words]
    if context_length:
        lines.append(f"{'num_ctx':<30} {context_length}")
    return "\n".join(lines)


def show_body(
    model: OllamaModel,
    facts: TemplateFacts | None = None,
    info: ModelInfo | None = None,
) -> dict[str, Any]:
    """``/api/show`` of ``model``; ``facts`` and ``info`` when it is the loaded model (its
    template as RadixChat renders it, its context as loaded)."""
    from core.engine.template_facts import reads_variable, template_reasons

    d = model.description
    model_info = dict(d.info) if d is not None else {}
    if facts is not None and info is not None:
        template = facts.template
        takes_tools, reasons, stops = facts.takes_tools, facts.reasons, facts.stop_words
        context = info.context_length
        architecture = (d.architecture if d is not None else "") or info.model_type
        model_info.setdefault("general.architecture", architecture)
        model_info[f"{architecture}.context_length"] = context
    else:
        template = d.chat_template if d is not None else ""
        takes_tools = reads_variable(template, "tools")
        reasons = template_reasons(template)
        stops, context = (), d.context_length if d is not None else None
    return {
        "modelfile": f"# Modelfile of {model.name}, served by RadixChat\nFROM {model.spec}\n",
        "parameters": parameters_text(stops, context),
        "template": template,
        "details": model.details(),
        "model_info": model_info,
        "capabilities": capabilities(takes_tools, reasons),
        "modified_at": timestamp(model.modified_at),
        "radixchat": {"spec": model.spec, "loaded": facts is not None},
    }


def ps_body(
    model: OllamaModel, info: ModelInfo, stats: EngineStats, started_at: float
) -> dict[str, Any]:
    """``/api/ps``: the loaded model, its weights and KV pool in memory."""
    pool = stats.cache.pool_bytes if stats.cache is not None else 0
    size = info.weight_bytes + pool
    return {
        "models": [
            {
                "name": model.name,
                "model": model.name,
                "size": size,
                "digest": model.digest,
                "details": model.details(),
                "expires_at": timestamp(started_at + KEPT_FOR_S),
                "size_vram": 0 if runs_on_cpu() else size,
                "context_length": info.context_length,
            }
        ]
    }
