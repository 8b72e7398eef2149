"""A model described from its files, without loading it: its format, architecture, parameter
count, quantization, context length, chat template, and the facts of its header as GGUF
names them (``general.architecture``, ``llama.context_length``...).

A GGUF file is described from its header (its metadata, tokenizer arrays left out); an MLX
folder from ``config.json``, its tokenizer config and its safetensors headers. Plain file
reads (no mlx); a description is remembered by path, size and modification time (a GGUF
header with a large vocabulary takes a few hundred milliseconds to read). What Ollama's
``/api/tags`` and ``/api/show`` say about a model comes from here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from core.errors import UserError
from core.models.catalog import safetensors_parameter_count
from core.models.hub.client import quantization_of

TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
# config.json's names for the facts GGUF headers name {arch}.<key>
CONFIG_FACTS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "vocab_size": "vocab_size",
}


@dataclass(frozen=True)
class ModelDescription:
    """What a model's files say about it ("" / None where they say nothing)."""

    format: str  # "gguf" | "safetensors"
    architecture: str = ""
    parameter_count: int | None = None
    quantization: str = ""  # "Q4_1", "Q4_K_M", "4bit", "F32"...
    context_length: int | None = None
    chat_template: str = ""
    license: str = ""  # as the files name it ("apache-2.0"); "" where they do not
    # scalar facts under GGUF's names (a GGUF header's own, an MLX config's renamed)
    info: dict[str, Any] = field(default_factory=dict, compare=False)


def describe_model(path: Path) -> ModelDescription:
    """The description of a ``.gguf`` file or an MLX model folder; :class:`UserError` when
    it cannot be read."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if path.is_dir():
        # the files it reads are the cache key: a changed config or model card is read again
        mtimes = tuple(
            f.stat().st_mtime_ns if f.is_file() else None
            for f in (path / "config.json", path / "README.md")
        )
        return _describe_folder(str(path), (stat.st_mtime_ns, *mtimes))
    return _describe_gguf(str(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=32)
def _describe_gguf(path: str, size: int, mtime_ns: int) -> ModelDescription:
    """(size and mtime are the cache key: a changed file is read again)"""
    from core.models.load.gguf_header import read_header

    header = read_header(Path(path))
    metadata = header.metadata
    architecture = str(metadata.get("general.architecture") or "")
    info = {
        key: value
        for key, value in metadata.items()
        if not isinstance(value, (list, tuple)) and key != "tokenizer.chat_template"
    }
    parameters = header.parameter_count() or None
    if parameters:
        info["general.parameter_count"] = parameters
    context = metadata.get(f"{architecture}.context_length")
    template = metadata.get("tokenizer.chat_template")
    return ModelDescription(
        format="gguf",
        architecture=architecture,
        parameter_count=parameters,
        quantization=_gguf_quantization(metadata.get("general.file_type"), Path(path).name),
        context_length=int(context) if isinstance(context, int) else None,
        chat_template=template if isinstance(template, str) else "",
        license=str(metadata.get("general.license") or ""),
        info=info,
    )


def _gguf_quantization(file_type: Any, name: str) -> str:
    """GGUF's ``general.file_type`` by name (``MOSTLY_Q4_1`` -> ``Q4_1``), else the file name's."""
    from gguf import LlamaFileType

    try:
        return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return quantization_of(name) or ""


@lru_cache(maxsize=32)
def _describe_folder(path: str, mtimes: tuple) -> ModelDescription:
    folder = Path(path)
    config = _read_json(folder / "config.json")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    merged = {**config, **text}
    architecture = str(merged.get("model_type") or "")
    parameters = safetensors_parameter_count(folder)
    info: dict[str, Any] = {"general.architecture": architecture} if architecture else {}
    for gguf_key, config_key in CONFIG_FACTS.items():
        value = merged.get(config_key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            info[f"{architecture}.{gguf_key}"] = value
    if parameters:
        info["general.parameter_count"] = parameters
    context = merged.get("max_position_embeddings")
    return ModelDescription(
        format="safetensors",
        architecture=architecture,
        parameter_count=parameters,
        quantization=_folder_quantization(merged, folder.name),
        context_length=context if isinstance(context, int) else None,
        chat_template=_folder_template(folder),
        license=str(merged.get("license") or "") or _readme_license(folder),
        info=info,
    )


def _readme_license(folder: Path) -> str:
    """The ``license:`` of a model card's front matter (README.md, as the hub writes it)."""
    try:
        text = (folder / "README.md").read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError:
        return ""
    if not text.startswith("---"):
        return ""
    for line in text.splitlines()[1:]:
        if line.strip() == "---":
            break
        key, _, value = line.partition(":")
        if key.strip() == "license" and value.strip():
            return value.strip().strip("\"'")
    return ""


def _folder_quantization(config: dict, name: str) -> str:
    quantization = config.get("quantization") or config.get("quantization_config")
    if isinstance(quantization, dict) and isinstance(quantization.get("bits"), int):
        return f"{quantization['bits']}bit"
    dtype = config.get("torch_dtype") or config.get("dtype")
    named = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
    return named.get(str(dtype), "") or quantization_of(name) or ""


def _folder_template(folder: Path) -> str:
    """The chat template of an MLX folder: its own file, else its tokenizer config's."""
    for name in TEMPLATE_FILES:
        file = folder / name
        if file.is_file():
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeError):
                continue
            if name.endswith(".json"):
                value = _loads(text).get("chat_template")
                text = value if isinstance(value, str) else ""
            if text:
                return text
    template = _read_json(folder / "tokenizer_config.json").get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), "")
    return template if isinstance(template, str) else ""


def _read_json(path: Path) -> dict:
    try:
        return _loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError):
        return {}


def _loads(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
