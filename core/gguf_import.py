"""Import a GGUF file as an mlx-lm model and a Hugging Face tokenizer.

MLX's own reader (``mx.load``) returns GGUF tensors by their llama.cpp names and keeps
Q4_0 / Q4_1 / Q8_0 quantized as MLX affine triples (``weight``, ``scales``, ``biases``).
We rename them to mlx-lm's names, build the hyper-parameters from the GGUF metadata,
instantiate the mlx-lm model class and quantize exactly the modules that arrive
quantized. llama.cpp's converter permutes the Q/K rows of llama models for interleaved
RoPE, so llama imports run with ``rope_traditional=True`` instead of un-permuting.

The tokenizer comes from the metadata through transformers' GGUF tokenizer builders
(which need no PyTorch); the chat template is the file's own.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from core.errors import ModelLoadError

# llama.cpp tensor name (per block) -> mlx-lm module path, for llama-family models.
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
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias|scales|biases)$")
_TOP_RE = re.compile(r"^([a-z_]+)\.(weight|bias|scales|biases)$")

SUPPORTED_ARCHITECTURES = ("llama",)


@dataclass(frozen=True)
class GGUFContents:
    """What a GGUF file holds, as plain values plus MLX arrays (engine thread only)."""

    architecture: str
    config: dict[str, Any]
    weights: dict[str, mx.array]
    metadata: dict[str, Any]


def _plain(value: Any) -> Any:
    """GGUF metadata from ``mx.load`` as plain Python values."""
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def read_gguf(path: Path) -> GGUFContents:
    """Read tensors and metadata; raise :class:`ModelLoadError` on a bad file."""
    try:
        weights, raw_meta = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError, OSError) as exc:
        raise ModelLoadError(
            f"{path.name} is not a readable GGUF file (truncated or corrupt?): {exc}"
        ) from exc
    metadata = {key: _plain(value) for key, value in raw_meta.items()}
    arch = metadata.get("general.architecture")
    if arch is None or not weights:
        raise ModelLoadError(f"{path.name} holds no model (no architecture or no tensors): truncated or corrupt?")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{path.name}: GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    config = _llama_config(metadata, weights, path)
    return GGUFContents(arch, config, _llama_weights(weights, path), metadata)


def _llama_config(meta: dict, weights: dict, path: Path) -> dict[str, Any]:
    def need(key: str) -> Any:
        if f"llama.{key}" not in meta:
            raise ModelLoadError(f"{path.name}: GGUF metadata lacks llama.{key}")
        return meta[f"llama.{key}"]

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
        "tie_word_embeddings": "output.weight" not in weights,
    }


def _llama_weights(weights: dict[str, mx.array], path: Path) -> dict[str, mx.array]:
    renamed: dict[str, mx.array] = {}
    for name, value in weights.items():
        if match := _BLOCK_RE.match(name):
            layer, part, kind = match.groups()
            target = _LLAMA_BLOCK_NAMES.get(part)
            if target is None:
                raise ModelLoadError(f"{path.name}: unexpected tensor {name}")
            renamed[f"model.layers.{layer}.{target}.{kind}"] = value
        elif (match := _TOP_RE.match(name)) and match.group(1) in _TOP_NAMES:
            renamed[f"{_TOP_NAMES[match.group(1)]}.{match.group(2)}"] = value
        elif name == "rope_freqs.weight":
            continue
        else:
            raise ModelLoadError(f"{path.name}: unexpected tensor {name}")
    return renamed


def build_model(config: dict[str, Any], weights: dict[str, mx.array]) -> nn.Module:
    """Instantiate the mlx-lm model class for ``config`` and load ``weights`` into it.

    Modules whose weights arrive as MLX-quantized triples are quantized with the bits and
    group size their shapes imply, so mixed files (Q8_0 embeddings, Q4_1 layers) work.
    """
    try:
        arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    except ImportError as exc:
        raise ModelLoadError(f"model type {config['model_type']!r} is not supported by mlx-lm") from exc
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


def build_tokenizer(metadata: dict[str, Any], cache_file: Path | None = None):
    """An mlx-lm ``TokenizerWrapper`` rebuilt from GGUF metadata.

    ``cache_file`` (a ``tokenizer.json`` path) is written after the first build and read
    on later loads: building a large SentencePiece vocabulary can take tens of seconds.
    """
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelLoadError("GGUF file carries no tokenizer (tokenizer.ggml.tokens missing)")
    if cache_file is not None and cache_file.exists():
        backend = Tokenizer.from_file(str(cache_file))
    else:
        backend = _convert_tokenizer(metadata)
        if cache_file is not None:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_suffix(".tmp")
            backend.save(str(tmp))
            tmp.replace(cache_file)

    def token(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None

    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
        unk_token=token("unknown_token_id"),
        pad_token=token("padding_token_id"),
        chat_template=metadata.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
    )
    hf_tokenizer.add_bos_token = bool(metadata.get("tokenizer.ggml.add_bos_token", False))
    vocab = hf_tokenizer.get_vocab()
    eos_ids = [vocab[t] for t in _EXTRA_EOS if t in vocab]
    return TokenizerWrapper(hf_tokenizer, eos_token_ids=eos_ids)


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


