"""GGUF tensors to mlx-lm parameters, through gguf-py's own name tables.

llama.cpp's converter names every tensor with ``gguf.TensorNameMap``: a Hugging Face name
(``model.layers.3.self_attn.q_proj``) to a GGUF one (``blk.3.attn_q``). mlx-lm's models keep
the Hugging Face names (with a few exceptions an architecture lists as ``aliases``: mlx-lm
stacks experts under ``switch_mlp`` where llama.cpp's converter names them ``experts``), so
asking the same table for each parameter of the mlx-lm model gives the mapping both ways
with no name written here. The model is built as a skeleton for its names only: its
random initial values are lazy and never computed.

Tensors llama.cpp adds that are no weights of the model (RoPE factors) become config
(:func:`rope_scaling_from_factors`).
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import gguf
import numpy as np
from gguf.constants import MODEL_ARCH_NAMES
from mlx.utils import tree_flatten

from core.errors import ModelLoadError
from core.models.load.gguf_architectures import GGUFArchitecture

ARCH_ENUMS = {name: arch for arch, name in MODEL_ARCH_NAMES.items()}
SUFFIXES = ("weight", "bias", "scales", "biases")  # what follows a module's name
ROPE_FACTOR_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def model_class(config: dict[str, Any]):
    """mlx-lm's ``(Model, ModelArgs)`` for ``config['model_type']``."""
    try:
        module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    except ImportError as exc:
        raise ModelLoadError(
            f"model type {config['model_type']!r} is not supported by mlx-lm"
        ) from exc
    return module.Model, module.ModelArgs


def name_table(arch: GGUFArchitecture, config: dict[str, Any]) -> dict[str, str]:
    """GGUF module name (``blk.0.attn_q``) -> mlx-lm module name, for every parameter of the
    model ``config`` describes."""
    model_cls, args_cls = model_class(config)
    skeleton = model_cls(args_cls.from_dict(config))
    names = gguf.TensorNameMap(ARCH_ENUMS[arch.name], config["num_hidden_layers"])
    table: dict[str, str] = {}
    for name, _ in tree_flatten(skeleton.parameters()):
        module = name.rpartition(".")[0]
        known = module
        for ours, theirs in arch.aliases:
            known = known.replace(ours, theirs)
        gguf_name = names.get_name(known)
        if gguf_name is None:
            continue  # a parameter the file must not lack: load_weights(strict=True) says so
        if table.setdefault(gguf_name, module) != module:
            raise ModelLoadError(f"{gguf_name} names both {table[gguf_name]} and {module}")
    return table


def rename(
    arch: GGUFArchitecture,
    config: dict[str, Any],
    weights: dict[str, Any],
    file_name: str,
) -> dict[str, Any]:
    """``weights`` (GGUF names) under mlx-lm's names, the converter's norm shift undone.

    Works on MLX arrays and NumPy arrays alike (``value - shift``)."""
    table = name_table(arch, config)
    renamed: dict[str, Any] = {}
    for name, value in weights.items():
        if name in ROPE_FACTOR_TENSORS:
            continue  # read into the config (rope_scaling_from_factors)
        module, _, kind = name.rpartition(".")
        if kind not in SUFFIXES or module not in table:
            raise ModelLoadError(
                f"{file_name}: tensor {name} has no place in mlx-lm's {arch.model_type} model"
            )
        if arch.norm_shift and kind == "weight" and module.endswith("norm"):
            value = value - arch.norm_shift
        target = table[module]
        if arch.permuted_qk and target.endswith(("q_proj", "k_proj")):
            heads = config[
                "num_attention_heads" if target.endswith("q_proj") else "num_key_value_heads"
            ]
            value = unpermute(value, heads)
        renamed[f"{target}.{kind}"] = value
    return renamed


def unpermute(rows, heads: int):
    """Undo llama.cpp's Q/K row permutation (each head's rows interleaved for its RoPE):
    back to the Hugging Face order mlx-lm's models rotate. Rows only, so quantized triples
    (packed weight, scales, biases) and biases undo alike."""
    shape = rows.shape
    return rows.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def rope_scaling_from_factors(
    factors: dict[str, np.ndarray], config: dict[str, Any], file_name: str
) -> dict[str, Any] | None:
    """``rope_scaling`` for the RoPE factor tensors llama.cpp writes instead of config:
    ``rope_freqs`` (Llama 3.x: the per-frequency factors its converter computed, matched
    back to the llama3 parameters that give them) and Phi-3's ``rope_factors_long/short``.
    """
    if "rope_factors_long.weight" in factors:
        return {
            "type": "longrope",
            "long_factor": factors["rope_factors_long.weight"].tolist(),
            "short_factor": factors.get(
                "rope_factors_short.weight", factors["rope_factors_long.weight"]
            ).tolist(),
        }
    if "rope_freqs.weight" not in factors:
        return None
    stored = factors["rope_freqs.weight"].astype(np.float64)
    dims = config["head_dim"]
    for original in (8192, 4096, 2048, 16384, 32768, 131072):
        for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0)):
            scaling = {
                "rope_type": "llama3",
                "factor": float(stored.max()),
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": original,
            }
            if np.allclose(llama3_factors(scaling, config["rope_theta"], dims), stored, rtol=1e-5):
                return scaling
    raise ModelLoadError(
        f"{file_name}: its rope_freqs factors match no llama3 RoPE scaling mlx-lm can compute"
    )


def llama3_factors(scaling: dict[str, Any], base: float, dims: int) -> np.ndarray:
    """The factors llama.cpp's converter writes as ``rope_freqs`` for a llama3 scaling."""
    freqs = 1.0 / (base ** (np.arange(0, dims, 2, dtype=np.float64) / dims))
    original = scaling["original_max_position_embeddings"]
    low, high, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)
