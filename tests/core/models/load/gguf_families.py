"""Tiny models of every architecture in RadixChat's GGUF table, written as llama.cpp's
converter (``convert_hf_to_gguf.py``) writes them: mlx-lm's model (random weights, as the
family matrix of tests/kvcache makes them) under the names gguf-py's ``TensorNameMap`` gives
the Hugging Face names, the metadata through ``GGUFWriter``, and the converter's own
changes to the checkpoint restated here from its source, independently of the import:
the llama family's Q/K row permutation, Gemma's ``1 + w`` norms, experts stacked as
``experts``, Llama 3's ``rope_freqs`` factors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType
from gguf.constants import MODEL_ARCH_NAMES
from mlx.utils import tree_flatten

from core.models.tiny_model import CHAT_TEMPLATE, SPECIAL_TOKENS, byte_alphabet
from tests.kvcache.family_weights import build_model, config_for


@dataclass(frozen=True)
class Case:
    """One architecture's tiny model: the mlx-lm family and config overrides."""

    family: str
    overrides: dict = field(default_factory=dict)
    permuted_qk: bool = False  # LlamaModel.permute in the converter
    norm_plus_one: bool = False  # Gemma*Model.modify_tensors: norm weights + 1


CASES: dict[str, Case] = {
    "llama": Case("llama", permuted_qk=True),
    "qwen2": Case("qwen2"),
    "qwen3": Case("qwen3"),
    "qwen3moe": Case("qwen3_moe"),
    "qwen2moe": Case("qwen2_moe"),
    "phi3": Case("phi3"),
    "gemma": Case("gemma", norm_plus_one=True),
    "gemma2": Case("gemma2", norm_plus_one=True),
    # llama.cpp's gemma3 makes every 6th layer global: 6 layers, the last one global
    "gemma3": Case(
        "gemma3_text",
        dict(num_hidden_layers=6, sliding_window_pattern=6, rope_local_base_freq=10000.0),
        norm_plus_one=True,
    ),
    "granite": Case(
        "granite",
        dict(
            attention_multiplier=0.2,
            embedding_multiplier=2.0,
            residual_multiplier=0.5,
            logits_scaling=1.5,
        ),
        permuted_qk=True,
    ),
    "olmo2": Case("olmo2"),
    "starcoder2": Case("starcoder2"),
}
ALIASES = (("mlp.switch_mlp.", "mlp.experts."),)  # the converter merges experts under this name
QUANT_BLOCK = 32  # Q8_0, Q5_0, Q4_0: blocks of 32 along a row


def model_and_config(arch: str, **overrides):
    """The mlx-lm model (weights evaluated) and config of architecture ``arch``'s case."""
    case = CASES[arch]
    settings = {**case.overrides, **overrides}
    return build_model(case.family, **settings), config_for(case.family, **settings)


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: each head's rows from halves to interleaved."""
    shape = weights.shape
    return (
        weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    )


def llama3_rope_factors(config: dict) -> np.ndarray:
    """``LlamaModel.generate_extra_tensors``: the llama3 scaling as per-frequency factors."""
    scaling = config["rope_scaling"]
    dim = config["head_dim"]
    freqs = 1.0 / (config["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def converted_tensors(arch: str, model, config: dict) -> dict[str, np.ndarray]:
    """The model's parameters as the converter writes them: GGUF names, float32."""
    case = CASES[arch]
    arch_enum = next(a for a, name in MODEL_ARCH_NAMES.items() if name == arch)
    names = gguf.TensorNameMap(arch_enum, config["num_hidden_layers"])
    tensors = {}
    for name, value in tree_flatten(model.parameters()):
        module, _, kind = name.rpartition(".")
        for ours, theirs in ALIASES:
            module = module.replace(ours, theirs)
        data = np.array(value.astype(mx.float32))
        if case.permuted_qk and module.endswith("q_proj"):
            data = permute(data, config["num_attention_heads"])
        if case.permuted_qk and module.endswith("k_proj"):
            data = permute(data, config["num_key_value_heads"])
        if case.norm_plus_one and name.endswith("norm.weight"):
            data = data + 1.0
        tensors[f"{names.get_name(module)}.{kind}"] = data
    if (config.get("rope_scaling") or {}).get("rope_type") == "llama3":
        tensors["rope_freqs.weight"] = llama3_rope_factors(config)
    return tensors


def quantizable(name: str, data: np.ndarray) -> bool:
    """What llama.cpp quantizes: matrices (and expert stacks) with whole blocks per row."""
    return data.ndim >= 2 and data.shape[-1] % QUANT_BLOCK == 0 and "rope" not in name


def dequantized(tensors: dict[str, np.ndarray], qtype: GGMLQuantizationType) -> dict:
    """Each tensor as the file of type ``qtype`` holds it, read back by the gguf package."""
    if qtype == GGMLQuantizationType.F32:
        return dict(tensors)
    return {
        name: gguf.quants.dequantize(gguf.quants.quantize(data, qtype), qtype)
        if quantizable(name, data)
        else data
        for name, data in tensors.items()
    }


def write_gguf(
    path: Path, arch: str, config: dict, tensors: dict, qtype=GGMLQuantizationType.F32
) -> Path:
    """A GGUF file as llama.cpp writes one: its metadata (``set_gguf_parameters``), the byte
    tokenizer of the tiny models as a ``gpt2`` vocabulary, then the tensors in ``qtype``."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    if arch == "starcoder2":
        writer.add_layer_norm_eps(config.get("norm_epsilon", 1e-5))
    else:
        writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if arch in ("qwen3moe", "qwen2moe"):
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if arch == "qwen2moe":
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config.get("attn_logit_softcapping", 50.0))
        writer.add_final_logit_softcapping(config.get("final_logit_softcapping", 30.0))
    if arch == "gemma3":
        writer.add_sliding_window(config["sliding_window"])
    if arch == "granite":
        writer.add_attention_scale(config["attention_multiplier"])
        writer.add_embedding_scale(config["embedding_multiplier"])
        writer.add_residual_scale(config["residual_multiplier"])
        writer.add_logit_scale(config["logits_scaling"])
    if arch == "phi3":
        writer.add_rope_dimension_count(config["head_dim"])
    tokens = [*byte_alphabet(), *SPECIAL_TOKENS]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(byte_alphabet()) + [3] * len(SPECIAL_TOKENS))
    writer.add_token_scores([0.0] * len(tokens))  # no merges: each byte its own token
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, data in tensors.items():
        if qtype != GGMLQuantizationType.F32 and quantizable(name, data):
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, data.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
