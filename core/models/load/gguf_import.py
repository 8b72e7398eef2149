"""Import a GGUF file as an mlx-lm model and a Hugging Face tokenizer.

Two routes to the tensors. A file holding only F32 / F16 / Q4_0 / Q4_1 / Q8_0 goes through
MLX's own reader (``mx.load``), which keeps those quantized as MLX affine triples
(``weight``, ``scales``, ``biases``). Any other file (K-quants, Q5_0, ...) goes through
:mod:`core.models.load.gguf_convert`, which converts it (to float32 on the CPU, to MLX's quantized
layout on Metal; exactly, see there) and keeps the result in a :class:`ConversionCache`,
so only the first load pays for it. Either way the tensors are
renamed to mlx-lm's names, the hyper-parameters come from the GGUF metadata, and
:func:`build_model` quantizes exactly the modules that arrive quantized.

Per architecture, what llama.cpp's converter did to the checkpoint is undone here:
- ``llama``: Q/K rows are permuted for interleaved RoPE, so imports run with
  ``rope_traditional=True`` instead of un-permuting.
- ``gemma3`` (mlx-lm ``gemma3_text``): no permutation (NeoX-style RoPE, as mlx-lm's model
  has it); every RMSNorm weight is stored as ``1 + w`` while mlx-lm adds the 1 itself,
  so 1 is subtracted; llama.cpp fixes what the metadata leaves out (every 6th layer is
  global, local RoPE base 10000, attention scale ``head_dim ** -0.5``, or
  ``(hidden / heads) ** -0.5`` for the 27B), and so do we.
A file without ``output.weight`` has tied embeddings (the model's ``sanitize`` sees that).

The tokenizer comes from the metadata through transformers' GGUF tokenizer builders
(which need no PyTorch); the chat template is the file's own, or Gemma's turn markers
for a Gemma base model that carries none.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from core.errors import ModelLoadError
from core.models.load.gguf_convert import ConversionCache, convert_tensors, default_layout
from core.models.load.gguf_header import GGUFHeader, read_header

log = logging.getLogger(__name__)

# llama.cpp tensor name (per block) -> mlx-lm module path
_LLAMA_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GEMMA3_BLOCK_NAMES = {
    **{k: v for k, v in _LLAMA_BLOCK_NAMES.items() if not k.endswith("norm")},
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias|scales|biases)$")
_TOP_RE = re.compile(r"^([a-z_]+)\.(weight|bias|scales|biases)$")
_SKIPPED = {"rope_freqs.weight"}  # llama3 rope factors: mlx-lm computes them from the config


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
    arch = metadata.get("general.architecture")
    if arch is None or not header.tensors:
        raise ModelLoadError(
            f"{path.name} holds no model (no architecture or no tensors): truncated or corrupt?"
        )
    if arch not in _ARCHITECTURES:
        raise ModelLoadError(
            f"{path.name}: GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    config = _ARCHITECTURES[arch].config(metadata, _shapes(header), path)
    if header.mlx_reads_exactly():
        try:
            raw = mx.load(str(path))
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelLoadError(
                f"{path.name} is not a readable GGUF file (truncated or corrupt?): {exc}"
            ) from exc
        return GGUFContents(arch, config, map_weights(arch, raw, path), metadata)
    weights = cache.load(config) if cache is not None else None
    if weights is None:
        layout = cache.layout if cache is not None else default_layout()
        started = time.perf_counter()
        weights = map_weights(arch, convert_tensors(path, header, layout), path)
        if cache is not None and cache.worth_keeping(time.perf_counter() - started):
            cache.save(config, weights)
    return GGUFContents(arch, config, weights, metadata)


def _shapes(header: GGUFHeader) -> dict[str, tuple[int, ...]]:
    return {t.name: t.shape for t in header.tensors}


def _require(meta: dict, prefix: str, path: Path) -> Callable[[str], Any]:
    def need(key: str) -> Any:
        if f"{prefix}.{key}" not in meta:
            raise ModelLoadError(f"{path.name}: GGUF metadata lacks {prefix}.{key}")
        return meta[f"{prefix}.{key}"]

    return need


def _vocab_size(meta: dict, shapes: dict, arch: str) -> int:
    if "token_embd.weight" in shapes:
        return int(shapes["token_embd.weight"][0])
    return int(meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", [])))


def _llama_config(meta: dict, shapes: dict, path: Path) -> dict[str, Any]:
    need = _require(meta, "llama", path)
    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    vocab = meta.get("llama.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    head_dim = int(meta.get("llama.attention.key_length") or hidden // heads)
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": int(need("block_count")),
        "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv") or heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "vocab_size": int(vocab),
        "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
        "rope_traditional": True,  # llama.cpp permuted Q/K for interleaved RoPE
        "max_position_embeddings": int(meta.get("llama.context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in shapes,
    }


def _gemma3_config(meta: dict, shapes: dict, path: Path) -> dict[str, Any]:
    """mlx-lm ``gemma3_text`` arguments, the way llama.cpp's gemma3 loader reads the file."""
    need = _require(meta, "gemma3", path)
    layers, hidden = int(need("block_count")), int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    head_dim = int(meta.get("gemma3.attention.key_length") or hidden // heads)
    if int(meta.get("gemma3.attention.value_length") or head_dim) != head_dim:
        raise ModelLoadError(
            f"{path.name}: Gemma 3 with key and value heads of different sizes is not supported"
        )
    if meta.get("gemma3.final_logit_softcapping") or meta.get("gemma3.attn_logit_softcapping"):
        raise ModelLoadError(
            f"{path.name}: logit soft-capping is not supported by mlx-lm's gemma3_text"
        )
    window = int(meta.get("gemma3.attention.sliding_window") or 0)
    config = {
        "model_type": "gemma3_text",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("gemma3.attention.head_count_kv") or heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "vocab_size": _vocab_size(meta, shapes, "gemma3"),
        "rope_theta": float(meta.get("gemma3.rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": 10_000.0,  # llama.cpp: rope_freq_base_train_swa, not in the file
        # llama.cpp: 1/sqrt(head_dim), except the 27B (62 layers): 1/sqrt(hidden / heads)
        "query_pre_attn_scalar": hidden // heads if layers == 62 else head_dim,
        "sliding_window": window or int(meta.get("gemma3.context_length", 32768)),
        # every 6th layer global; none without a window
        "sliding_window_pattern": 6 if window else 1,
        "max_position_embeddings": int(meta.get("gemma3.context_length", 32768)),
        "rope_scaling": None,
        "tie_word_embeddings": "output.weight" not in shapes,
    }
    scaling = meta.get("gemma3.rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise ModelLoadError(
                f"{path.name}: RoPE scaling {scaling!r} is not supported for Gemma 3"
            )
        config["rope_scaling"] = {
            "type": "linear",
            "factor": float(meta["gemma3.rope.scaling.factor"]),
        }
    return config


@dataclass(frozen=True)
class _Architecture:
    config: Callable[[dict, dict, Path], dict[str, Any]]
    block_names: dict[str, str]
    norm_shift: float  # what llama.cpp's converter added to every ``*norm.weight``


_ARCHITECTURES = {
    "llama": _Architecture(_llama_config, _LLAMA_BLOCK_NAMES, 0.0),
    "gemma3": _Architecture(_gemma3_config, _GEMMA3_BLOCK_NAMES, 1.0),
}
SUPPORTED_ARCHITECTURES = tuple(_ARCHITECTURES)


def mlx_tensor_name(architecture: str, gguf_name: str) -> str | None:
    """mlx-lm's name for a llama.cpp tensor name; None for one the model does not use."""
    if gguf_name in _SKIPPED:
        return None
    if match := _BLOCK_RE.match(gguf_name):
        layer, part, kind = match.groups()
        target = _ARCHITECTURES[architecture].block_names.get(part)
        return None if target is None else f"model.layers.{layer}.{target}.{kind}"
    if (match := _TOP_RE.match(gguf_name)) and match.group(1) in _TOP_NAMES:
        return f"{_TOP_NAMES[match.group(1)]}.{match.group(2)}"
    return None


def map_weights(architecture: str, weights: dict[str, mx.array], path: Path) -> dict[str, mx.array]:
    """GGUF tensors under mlx-lm's names, with the architecture's norm shift undone."""
    shift = _ARCHITECTURES[architecture].norm_shift
    renamed: dict[str, mx.array] = {}
    for name, value in weights.items():
        if name in _SKIPPED:
            continue
        target = mlx_tensor_name(architecture, name)
        if target is None:
            raise ModelLoadError(f"{path.name}: unexpected tensor {name}")
        if shift and name.endswith("norm.weight"):
            value = value - shift
        renamed[target] = value
    return renamed


def _llama_weights(weights: dict[str, mx.array], path: Path) -> dict[str, mx.array]:
    return map_weights("llama", weights, path)


def build_model(config: dict[str, Any], weights: dict[str, mx.array]) -> nn.Module:
    """Instantiate the mlx-lm model class for ``config`` and load ``weights`` into it.

    Modules whose weights arrive as MLX-quantized triples are quantized with the bits and
    group size their shapes imply, so mixed files (Q8_0 embeddings, Q4_1 layers) work.
    """
    try:
        arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    except ImportError as exc:
        raise ModelLoadError(
            f"model type {config['model_type']!r} is not supported by mlx-lm"
        ) from exc
    model = arch.Model(arch.ModelArgs.from_dict(config))
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
