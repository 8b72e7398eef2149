"""Import a GGUF file as an mlx-lm model and a Hugging Face tokenizer.

Two routes to the tensors. A file holding only F32 / F16 / Q4_0 / Q4_1 / Q8_0 goes through
MLX's own reader (``mx.load``), which keeps those quantized as MLX affine triples
(``weight``, ``scales``, ``biases``). Any other file (K-quants, Q5_0, ...) goes through
:mod:`core.models.load.gguf_convert`, which converts it (to float32 on the CPU, to MLX's quantized
layout on Metal; exactly, see there) and keeps the result in a :class:`ConversionCache`,
so only the first load pays for it. Either way the tensors are
renamed to mlx-lm's names, the hyper-parameters come from the GGUF metadata, and
:func:`build_model` quantizes exactly the modules that arrive quantized.

Which mlx-lm model a file becomes, and what llama.cpp's converter did to the checkpoint,
is a table (:mod:`core.models.load.gguf_architectures`); the tensor names come from gguf-py's
``TensorNameMap`` (:mod:`core.models.load.gguf_names`).
A file without ``output.weight`` has tied embeddings (the model's ``sanitize`` sees that).

The tokenizer comes from the metadata through transformers' GGUF tokenizer builders
(which need no PyTorch); the chat template is the file's own, or Gemma's turn markers
for a Gemma base model that carries none.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf import GGMLQuantizationType

from core.errors import ModelLoadError
from core.models.load.gguf_architectures import ARCHITECTURES, architecture_of, model_config
from core.models.load.gguf_convert import ConversionCache, convert_tensors, default_layout
from core.models.load.gguf_header import GGUFHeader, read_header
from core.models.load.gguf_names import (
    ROPE_FACTOR_TENSORS,
    model_class,
    rename,
    rope_scaling_from_factors,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GGUFContents:
    """What a GGUF file holds, as plain values plus MLX arrays (engine thread only)."""

    architecture: str
    config: dict[str, Any]
    weights: dict[str, mx.array]
    metadata: dict[str, Any]


def read_gguf(path: Path, cache: ConversionCache | None = None) -> GGUFContents:
    """Read tensors and metadata; raise :class:`ModelLoadError` on a bad file.

    ``cache`` reads back the conversion of files ``mx.load`` cannot read as stored (in the
    cache's layout), and keeps a new one when it was slow (``ConversionCache.worth_keeping``);
    without one such a file is converted, in the device's default layout, on every load.
    """
    header = read_header(path)
    metadata = header.metadata
    if metadata.get("general.architecture") is None or not header.tensors:
        raise ModelLoadError(
            f"{path.name} holds no model (no architecture or no tensors): truncated or corrupt?"
        )
    arch = architecture_of(metadata, path.name)
    config = gguf_config(header, path)
    if header.mlx_reads_exactly():
        try:
            raw = mx.load(str(path))
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelLoadError(
                f"{path.name} is not a readable GGUF file (truncated or corrupt?): {exc}"
            ) from exc
        return GGUFContents(arch.name, config, rename(arch, config, raw, path.name), metadata)
    weights = cache.load(config) if cache is not None else None
    if weights is None:
        layout = cache.layout if cache is not None else default_layout()
        started = time.perf_counter()
        weights = rename(arch, config, convert_tensors(path, header, layout), path.name)
        if cache is not None and cache.worth_keeping(time.perf_counter() - started):
            cache.save(config, weights)
    return GGUFContents(arch.name, config, weights, metadata)


def gguf_config(header: GGUFHeader, path: Path) -> dict[str, Any]:
    """mlx-lm's config for the file: its metadata through the architecture table, and the
    RoPE factors llama.cpp stores as tensors."""
    shapes = {t.name: t.shape for t in header.tensors}
    config = model_config(header.metadata, shapes, path.name)
    factors = {}
    for info in header.tensors:
        if info.name in ROPE_FACTOR_TENSORS:
            if info.ggml_type != GGMLQuantizationType.F32:
                raise ModelLoadError(f"{path.name}: {info.name} is not stored as F32")
            factors[info.name] = np.fromfile(
                path, dtype=np.float32, count=math.prod(info.shape), offset=info.offset
            )
    scaling = rope_scaling_from_factors(factors, config, path.name)
    if scaling is not None:
        config["rope_scaling"] = scaling
    return config


def map_weights(architecture: str, config: dict[str, Any], weights: dict, path: Path) -> dict:
    """GGUF tensors under mlx-lm's names, the converter's norm shift undone."""
    return rename(ARCHITECTURES[architecture], config, weights, path.name)


def build_model(config: dict[str, Any], weights: dict[str, mx.array]) -> nn.Module:
    """Instantiate the mlx-lm model class for ``config`` and load ``weights`` into it.

    Modules whose weights arrive as MLX-quantized triples are quantized with the bits and
    group size their shapes imply, so mixed files (Q8_0 embeddings, Q4_1 layers) work.
    """
    model_cls, args_cls = model_class(config)
    model = model_cls(args_cls.from_dict(config))
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)

    def quantization_of(path: str, module: nn.Module) -> dict | bool:
        scales = weights.get(f"{path}.scales")
        if scales is None or not hasattr(module, "to_quantized"):
            return False
        in_features = module.weight.shape[-1]
        packed = weights[f"{path}.weight"].shape[-1]
        return {"group_size": in_features // scales.shape[-1], "bits": packed * 32 // in_features}

    nn.quantize(model, class_predicate=quantization_of)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"weights do not fit the {config['model_type']} model: {exc}") from exc
    return model


# ---------------------------------------------------------------- tokenizer


_EXTRA_EOS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "</s>", "<eos>")
_CONTROL = 3  # llama.cpp token type of special tokens

# Gemma's turn markers, for a Gemma base model whose file carries no template: the system
# prompt goes first in the first user turn, the assistant speaks as "model".
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set system = '' -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] + '\n\n' -%}{%- set messages = messages[1:] -%}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (system if loop.first else '') + "
    "message['content'] | trim + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def build_tokenizer(metadata: dict[str, Any], cache_file: Path | None = None):
    """An mlx-lm ``TokenizerWrapper`` rebuilt from GGUF metadata.

    ``cache_file`` (a ``tokenizer.json`` path) is written after the first build and read
    on later loads: building a large SentencePiece vocabulary takes seconds to tens of
    seconds. Both loads construct the tokenizer from that same file, so they agree.
    """
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    if not metadata.get("tokenizer.ggml.tokens"):
        raise ModelLoadError("GGUF file carries no tokenizer (tokenizer.ggml.tokens missing)")
    hf_tokenizer = None
    if cache_file is not None and cache_file.exists():
        try:
            hf_tokenizer = _hf_tokenizer(metadata, tokenizer_file=str(cache_file))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises bare Exceptions on a bad file
            log.warning("tokenizer cache %s is unreadable (%s): building it again", cache_file, exc)
            cache_file.unlink(missing_ok=True)
    if hf_tokenizer is None:
        backend = _convert_tokenizer(metadata)
        if cache_file is None:
            hf_tokenizer = _hf_tokenizer(metadata, tokenizer_object=backend)
        else:
            _keep_tokenizer(backend, cache_file)
            hf_tokenizer = _hf_tokenizer(metadata, tokenizer_file=str(cache_file))
    from core.models.load.chat_template import tool_calling

    return TokenizerWrapper(
        hf_tokenizer, eos_token_ids=_eos_ids(metadata), **tool_calling(hf_tokenizer)
    )


def _keep_tokenizer(backend, cache_file: Path) -> None:
    """Write the tokenizer to ``cache_file`` whole or not at all: into a temporary file of
    this process's own, then moved into place. Two processes importing the same file at once
    each write their own (the same bytes) and the last move wins; a reader only ever sees a
    whole file."""
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=cache_file.parent, prefix=f".{cache_file.stem}.", suffix=".tmp")
    os.close(fd)
    try:
        backend.save(name)
        os.replace(name, cache_file)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


def _hf_tokenizer(metadata: dict[str, Any], **source: Any):
    """A fast tokenizer from a ``tokenizer_file`` (quick) or a ``tokenizer_object`` (copied)."""
    from transformers import PreTrainedTokenizerFast

    tokens = metadata["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None

    hf_tokenizer = PreTrainedTokenizerFast(
        **source,
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
        unk_token=token("unknown_token_id"),
        pad_token=token("padding_token_id"),
        chat_template=metadata.get("tokenizer.chat_template") or _default_chat_template(metadata),
        clean_up_tokenization_spaces=False,
    )
    # llama.cpp adds BOS to a sentencepiece vocabulary whose file does not say otherwise
    sentencepiece = metadata.get("tokenizer.ggml.model") == "llama"
    hf_tokenizer.add_bos_token = bool(metadata.get("tokenizer.ggml.add_bos_token", sentencepiece))
    return hf_tokenizer


def _eos_ids(metadata: dict[str, Any]) -> list[int]:
    """The file's EOS plus the end-of-turn tokens it marks as control tokens."""
    tokens = metadata["tokenizer.ggml.tokens"]
    types = metadata.get("tokenizer.ggml.token_type") or []
    ids = (
        [metadata["tokenizer.ggml.eos_token_id"]]
        if "tokenizer.ggml.eos_token_id" in metadata
        else []
    )
    index = {
        t: i
        for i, t in enumerate(tokens)
        if i < len(types) and types[i] == _CONTROL and t in _EXTRA_EOS
    }
    if not types:  # no types in the file: trust the names
        index = {t: i for i, t in enumerate(tokens) if t in _EXTRA_EOS}
    return sorted(set(ids) | set(index.values()))


def _default_chat_template(metadata: dict[str, Any]) -> str | None:
    arch = str(metadata.get("general.architecture", ""))
    if arch.startswith("gemma") and "<start_of_turn>" in metadata["tokenizer.ggml.tokens"]:
        return GEMMA_CHAT_TEMPLATE
    return None


def _convert_tokenizer(metadata: dict[str, Any]):
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    renames = {
        "model": "tokenizer_type",
        "pre": "pre_tokenizer_type",
        "tokens": "tokens",
        "scores": "scores",
        "token_type": "token_type",
        "merges": "merges",
        "bos_token_id": "bos_token_id",
        "eos_token_id": "eos_token_id",
        "unknown_token_id": "unk_token_id",
        "padding_token_id": "pad_token_id",
        "add_space_prefix": "add_prefix_space",
    }
    tokenizer_dict = {
        name: metadata[f"tokenizer.ggml.{key}"]
        for key, name in renames.items()
        if f"tokenizer.ggml.{key}" in metadata
    }
    try:
        backend, _ = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    except (ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot build the tokenizer from GGUF metadata: {exc}") from exc
    return backend
