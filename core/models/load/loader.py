"""Load a model spec into an mlx-lm model and tokenizer, with its fingerprint.

A spec is a known model name (``default``, ``gemma3-270m``), a ``.gguf`` file, a local
MLX model directory (config.json + safetensors + tokenizer), or a Hugging Face repo id
found in the local HF cache. Loading happens on the engine thread: the result holds
MLX arrays and never crosses threads; :class:`ModelInfo` is its plain-value summary.

Weight format: on Metal the weights stay as stored (quantized stays quantized). On the
CPU backend quantized matmuls are slow and float16 arithmetic is slow on x86, so
``auto`` dequantizes to float32 there (measured: docs/benchmarks.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from core.errors import ModelLoadError
from core.models import usage
from core.models.base_models import is_base_model
from core.models.hashing import FileHashCache
from core.models.hub import hf_cache
from core.models.load.chat_template import shipped_template, with_chat_template
from core.models.load.fingerprint import model_fingerprint
from core.models.load.gguf_import import build_model, build_tokenizer, read_gguf
from core.models.load.memory_estimate import check_fits, machine_memory
from core.models.pypi import provision
from core.models.pypi.known import KNOWN_MODELS

WEIGHT_FORMATS = ("auto", "stored", "float32", "float16", "bfloat16")
ProgressFn = Callable[[str, "float | None"], None]


@dataclass(frozen=True)
class ModelInfo:
    """Plain facts about a loaded model: safe to pass to any thread."""

    spec: str
    name: str
    path: str
    model_type: str
    fingerprint: str
    weights_format: str
    weight_bytes: int
    context_length: int
    num_layers: int
    load_seconds: float
    # a base model: completion only (no chat template in its files, or named base;
    # core.models.base_models); chat requests still get replies through a fallback template
    base: bool = False
    parameters: int = 0  # the weights' count (as loaded: a group's rank, its part)
    chat_template: str = ""  # the Jinja template replies go through (the model's, or ours)


@dataclass
class LoadedModel:
    """The model as the engine uses it (MLX objects: engine thread only)."""

    model: nn.Module
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    config: dict[str, Any]
    info: ModelInfo


def resolve_weights_format(requested: str) -> str:
    if requested not in WEIGHT_FORMATS:
        raise ModelLoadError(
            f"unknown weight format {requested!r} (choose from {', '.join(WEIGHT_FORMATS)})"
        )
    if requested != "auto":
        return requested
    return "stored" if mx.default_device() == mx.gpu else "float32"


def resolve_spec(spec: str, data_root: Path, progress: ProgressFn | None = None) -> Path:
    """The file or folder a spec names, fetching a known model if needed."""
    if spec in KNOWN_MODELS:
        return provision.ensure_model(spec, data_root, progress)
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if hf_cache.split_gguf_spec(spec) is not None:
        found = hf_cache.resolve_gguf(spec)
        if found is not None:
            return found
        raise ModelLoadError(
            f"{spec} is not in the local Hugging Face cache ({hf_cache.hf_cache_root()}); "
            f"get it with `radixchat pull {spec}`"
        )
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        found = hf_cache.resolve_repo(spec)
        if found is not None:
            return found
        raise ModelLoadError(
            f"{spec} is not in the local Hugging Face cache ({hf_cache.hf_cache_root()}) or not "
            f"complete there; get it with `radixchat pull {spec}`, or give a local path"
        )
    raise ModelLoadError(
        f"no model at {spec}: give a .gguf file, an MLX model folder, or one of: "
        f"{', '.join(KNOWN_MODELS)}"
    )


def model_name(path: Path) -> str:
    """What a model is called (the window, the status bar, ``/v1/models``): a file's stem, a
    folder's name, a hub repo's ``org/name`` (its snapshot folder's name is a commit id)."""
    if path.is_file():
        return path.stem
    return hf_cache.repo_of_snapshot(path) or path.name


def load_model(
    spec: str,
    data_root: Path,
    weights_format: str = "auto",
    progress: ProgressFn | None = None,
    chat_template: str | None = None,
    shard: Callable[[nn.Module], None] | None = None,
    parts: int = 1,
) -> LoadedModel:
    """Load ``spec``; every failure a user can fix is a :class:`ModelLoadError`.

    ``chat_template`` (Jinja text) replaces the model's own template; without it, a known
    model may come with a better one from ``resources/`` (the default model's takes tools).
    ``shard`` (a rank of a group: ``core.distributed``) cuts the model to this machine's
    part while an MLX folder's weights are still lazy, so only that part is read into memory;
    ``parts`` is how many machines share the model (the memory check counts all of theirs).
    """
    started = time.perf_counter()
    fmt = resolve_weights_format(weights_format)
    path = resolve_spec(spec, data_root, progress)
    if progress:
        progress(f"loading {path.name}", None)
    if path.is_file() and path.suffix.lower() == ".gguf":
        model, tokenizer, config, files = _load_gguf(path, data_root, parts)
    elif path.is_dir():
        model, tokenizer, config, files = _load_mlx_dir(
            path, fmt, lazy=shard is not None, parts=parts
        )
    else:
        raise ModelLoadError(f"{path} is neither a .gguf file nor a model folder with config.json")
    template = chat_template or _known_template(path)
    if template is not None:
        tokenizer = with_chat_template(tokenizer, template)
    if shard is not None:
        shard(model)
    _apply_weights_format(model, fmt)
    mx.eval(model.parameters())
    hashes = FileHashCache.in_data_folder(data_root)
    fingerprint = model_fingerprint(config, files, fmt, hashes)
    usage.record_use(data_root, path, spec, fingerprint)
    weight_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    info = ModelInfo(
        spec=spec,
        name=model_name(path),
        path=str(path),
        model_type=str(config.get("model_type")),
        fingerprint=fingerprint,
        weights_format=fmt,
        weight_bytes=weight_bytes,
        context_length=_context_length(config),
        num_layers=len(getattr(model, "layers", [])),
        load_seconds=time.perf_counter() - started,
        base=is_base_model(path, model_name(path)),
        parameters=sum(v.size for _, v in tree_flatten(model.parameters())),
        chat_template=str(getattr(tokenizer, "chat_template", None) or ""),
    )
    return LoadedModel(model, tokenizer, config, info)


def _known_template(path: Path) -> str | None:
    known = next((m for m in KNOWN_MODELS.values() if m.filename == path.name), None)
    return shipped_template(known.chat_template) if known and known.chat_template else None


def _load_gguf(path: Path, data_root: Path, parts: int = 1):
    """A GGUF file's model and tokenizer; what is slow to rebuild (weights converted from
    K-quants, the tokenizer) is kept under ``data_root`` by the file's SHA-256."""
    from core.models.load.gguf_convert import ConversionCache

    digest = FileHashCache.in_data_folder(data_root).sha256(path)
    contents = read_gguf(path, ConversionCache.under(data_root, digest))
    # before the model is built
    check_fits(contents.config, path.name, memory=machine_memory() * parts)
    model = build_model(contents.config, dict(contents.weights))
    tokenizer = build_tokenizer(contents.metadata, data_root / "tokenizers" / f"{digest[:32]}.json")
    return model, tokenizer, contents.config, [path]


def _load_mlx_dir(path: Path, weights_format: str = "stored", lazy: bool = False, parts: int = 1):
    from mlx_lm.utils import load as mlx_lm_load

    config_file = path / "config.json"
    if not config_file.exists():
        raise ModelLoadError(f"{path} has no config.json: not an MLX model folder")
    try:
        config = json.loads(config_file.read_text())
    except ValueError as exc:
        raise ModelLoadError(f"{config_file} is not valid JSON: {exc}") from exc
    # before anything is built
    check_fits(config, str(config_file), weights_format, memory=machine_memory() * parts)
    weight_files = sorted(path.glob("*.safetensors"))
    if not weight_files:
        raise ModelLoadError(f"{path} has no .safetensors weights")
    try:
        model, tokenizer = mlx_lm_load(str(path), lazy=lazy)
    except ValueError as exc:
        if "not supported" in str(exc):
            raise ModelLoadError(
                f"{path.name}: model type {config.get('model_type')!r} is not supported"
            ) from exc
        raise ModelLoadError(f"{path.name}: cannot load weights: {exc}") from exc
    except (RuntimeError, OSError, KeyError) as exc:
        raise ModelLoadError(f"{path.name}: corrupt or truncated model files: {exc}") from exc
    tokenizer_files = [
        p for p in path.iterdir() if p.name.startswith("tokenizer") or p.suffix == ".model"
    ]
    return model, tokenizer, config, [config_file, *weight_files, *sorted(tokenizer_files)]


def _apply_weights_format(model: nn.Module, fmt: str) -> None:
    if fmt == "stored":
        return
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear
    from mlx_lm.utils import dequantize_model

    dtype = getattr(mx, fmt)
    quantized = (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)
    for _, module in model.named_modules():  # dequantize in the target precision
        # (a GGUF's scales arrive as float16: d * q in float16 would round Q8_0's values)
        if isinstance(module, quantized):
            module.scales = module.scales.astype(dtype)
            module.biases = module.biases.astype(dtype)
    dequantize_model(model)
    model.set_dtype(dtype)


def _context_length(config: dict[str, Any]) -> int:
    for key in ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length"):
        value = config.get(key) or config.get("text_config", {}).get(key)
        if value:
            return int(value)
    return 4096
