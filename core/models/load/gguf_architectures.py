"""What RadixChat knows of each GGUF architecture: the mlx-lm model that runs it, its
hyper-parameters read from the GGUF metadata, and what llama.cpp's converter did to the
checkpoint that the import undoes. A table, not a loader: the tensor names come from
gguf-py's own tables (:mod:`core.models.load.gguf_names`), the metadata keys from gguf-py's
``Keys`` constants, so a new architecture is one :class:`GGUFArchitecture` entry.

No mlx import: the model picker and the hub search read :data:`GGUF_ARCHITECTURES`.

What the converter (llama.cpp ``convert_hf_to_gguf.py``) does that an entry records:
- ``permuted_qk``: the llama family's Q/K rows are permuted for llama.cpp's interleaved
  RoPE; the import puts them back (the Hugging Face order every mlx-lm model rotates).
- ``norm_shift``: Gemma's RMSNorm weights are stored as ``1 + w``; mlx-lm adds the 1 itself.
- Hyper-parameters the file leaves out and llama.cpp fixes in code (Gemma's attention
  scale, Gemma 3's local RoPE base) are fixed here the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gguf.constants import Keys

from core.errors import ModelLoadError

LLM, ATTENTION, ROPE = Keys.LLM, Keys.Attention, Keys.Rope


class Metadata:
    """The GGUF metadata of one architecture, read by gguf-py's key templates
    (``Keys.LLM.BLOCK_COUNT`` is ``"{arch}.block_count"``)."""

    def __init__(self, metadata: dict[str, Any], arch: str, file_name: str) -> None:
        self.raw, self.arch, self.file_name = metadata, arch, file_name

    def get(self, template: str, default: Any = None) -> Any:
        value = self.raw.get(template.format(arch=self.arch))
        return default if value is None else value

    def need(self, template: str) -> Any:
        key = template.format(arch=self.arch)
        if key not in self.raw:
            raise ModelLoadError(f"{self.file_name}: GGUF metadata lacks {key}")
        return self.raw[key]

    def integer(self, template: str, default: int | None = None) -> int | None:
        """An integer key; a per-layer list (some files give one) must hold one value."""
        value = self.get(template, default)
        if isinstance(value, list):
            if len(set(value)) != 1:
                key = template.format(arch=self.arch)
                raise ModelLoadError(
                    f"{self.file_name}: {key} differs between layers, which mlx-lm's "
                    f"{self.arch} model does not support"
                )
            value = value[0]
        return None if value is None else int(value)


Extra = Callable[[Metadata, dict[str, Any], dict[str, tuple[int, ...]]], dict[str, Any]]


def _nothing(meta: Metadata, config: dict, shapes: dict) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class GGUFArchitecture:
    """One ``general.architecture`` value: how its file becomes an mlx-lm model."""

    name: str  # general.architecture, as llama.cpp writes it
    model_type: str  # the mlx-lm module (mlx_lm/models/<model_type>.py)
    permuted_qk: bool = False
    norm_shift: float = 0.0
    # the architecture's own keys and fixes, on top of the common config
    extra: Extra = _nothing
    # mlx-lm parameter-name parts that differ from the Hugging Face names gguf-py maps
    aliases: tuple[tuple[str, str], ...] = ()
    # norm epsilon under the name the mlx-lm model reads (RMSNorm or LayerNorm keys)
    eps_name: str = "rms_norm_eps"


MOE_ALIASES = (("mlp.switch_mlp.", "mlp.experts."),)  # mlx-lm stacks the experts as llama.cpp


def _qwen3moe(meta: Metadata, config: dict, shapes: dict) -> dict[str, Any]:
    return {
        "num_experts": meta.integer(LLM.EXPERT_COUNT),
        "num_experts_per_tok": meta.integer(LLM.EXPERT_USED_COUNT),
        "moe_intermediate_size": meta.integer(LLM.EXPERT_FEED_FORWARD_LENGTH),
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,  # llama.cpp's qwen3moe graph normalises the top-k weights
    }


def _qwen2moe(meta: Metadata, config: dict, shapes: dict) -> dict[str, Any]:
    return {
        "num_experts": meta.integer(LLM.EXPERT_COUNT),
        "num_experts_per_tok": meta.integer(LLM.EXPERT_USED_COUNT),
        "moe_intermediate_size": meta.integer(LLM.EXPERT_FEED_FORWARD_LENGTH),
        "shared_expert_intermediate_size": meta.integer(LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH),
    }


def _gemma_scale(meta: Metadata, config: dict, gemma_27b_layers: int) -> int:
    """llama.cpp's attention scale: 1/sqrt(head_dim), except the 27B: 1/sqrt(hidden/heads)."""
    if config["num_hidden_layers"] == gemma_27b_layers:
        return config["hidden_size"] // config["num_attention_heads"]
    return config["head_dim"]


def _gemma2(meta: Metadata, config: dict, shapes: dict) -> dict[str, Any]:
    return {
        "attn_logit_softcapping": float(meta.get(LLM.ATTN_LOGIT_SOFTCAPPING, 50.0)),
        "final_logit_softcapping": float(meta.get(LLM.FINAL_LOGIT_SOFTCAPPING, 30.0)),
        "query_pre_attn_scalar": _gemma_scale(meta, config, 46),
    }


def _gemma3(meta: Metadata, config: dict, shapes: dict) -> dict[str, Any]:
    """mlx-lm ``gemma3_text`` arguments, the way llama.cpp's gemma3 loader reads the file."""
    if meta.get(LLM.FINAL_LOGIT_SOFTCAPPING) or meta.get(LLM.ATTN_LOGIT_SOFTCAPPING):
        raise ModelLoadError(
            f"{meta.file_name}: logit soft-capping is not supported by mlx-lm's gemma3_text"
        )
    window = meta.integer(ATTENTION.SLIDING_WINDOW, 0)
    return {
        "rope_theta": float(meta.get(ROPE.FREQ_BASE, 1_000_000.0)),
        "rope_local_base_freq": 10_000.0,  # llama.cpp: rope_freq_base_train_swa, not in the file
        "query_pre_attn_scalar": _gemma_scale(meta, config, 62),
        "sliding_window": window or config["max_position_embeddings"],
        "sliding_window_pattern": 6 if window else 1,  # every 6th layer global
    }


def _granite(meta: Metadata, config: dict, shapes: dict) -> dict[str, Any]:
    """The four multipliers llama.cpp writes as ``*_scale`` (only when not zero)."""
    return {
        "embedding_multiplier": float(meta.get(LLM.EMBEDDING_SCALE, 1.0)),
        "residual_multiplier": float(meta.get(LLM.RESIDUAL_SCALE, 1.0)),
        "attention_multiplier": float(meta.get(ATTENTION.SCALE, config["head_dim"] ** -0.5)),
        "logits_scaling": float(meta.get(LLM.LOGIT_SCALE, 1.0)),
    }


def _phi3(meta: Metadata, config: dict, shapes: dict) -> dict[str, Any]:
    rotary = meta.integer(ROPE.DIMENSION_COUNT, config["head_dim"])
    extra: dict[str, Any] = {"partial_rotary_factor": rotary / config["head_dim"]}
    original = meta.integer(ROPE.SCALING_ORIG_CTX_LEN)
    if original:
        extra["original_max_position_embeddings"] = original
    return extra


def _starcoder2(meta: Metadata, config: dict, shapes: dict) -> dict[str, Any]:
    return {"rope_theta": float(meta.get(ROPE.FREQ_BASE, 100_000.0))}


_ENTRIES = (
    GGUFArchitecture("llama", "llama", permuted_qk=True),  # Mistral and Llama 3.x too
    GGUFArchitecture("qwen2", "qwen2"),
    GGUFArchitecture("qwen3", "qwen3"),
    GGUFArchitecture("qwen3moe", "qwen3_moe", extra=_qwen3moe, aliases=MOE_ALIASES),
    GGUFArchitecture("qwen2moe", "qwen2_moe", extra=_qwen2moe, aliases=MOE_ALIASES),
    GGUFArchitecture("phi3", "phi3", extra=_phi3),  # Phi-3, Phi-3.5, Phi-4
    GGUFArchitecture("gemma", "gemma", norm_shift=1.0),
    GGUFArchitecture("gemma2", "gemma2", norm_shift=1.0, extra=_gemma2),
    GGUFArchitecture("gemma3", "gemma3_text", norm_shift=1.0, extra=_gemma3),
    GGUFArchitecture("granite", "granite", permuted_qk=True, extra=_granite),
    GGUFArchitecture("olmo2", "olmo2"),
    GGUFArchitecture("starcoder2", "starcoder2", extra=_starcoder2, eps_name="norm_epsilon"),
)
ARCHITECTURES: dict[str, GGUFArchitecture] = {a.name: a for a in _ENTRIES}
GGUF_ARCHITECTURES = tuple(ARCHITECTURES)


def architecture_of(metadata: dict[str, Any], file_name: str) -> GGUFArchitecture:
    """The table's entry for a file, or :class:`ModelLoadError` naming what it is and what
    runs."""
    name = metadata.get(Keys.General.ARCHITECTURE)
    if name is None:
        raise ModelLoadError(f"{file_name} holds no model (no general.architecture)")
    if name not in ARCHITECTURES:
        raise ModelLoadError(
            f"{file_name}: GGUF architecture {name!r} is not supported "
            f"(supported: {', '.join(GGUF_ARCHITECTURES)})"
        )
    return ARCHITECTURES[name]


def model_config(
    metadata: dict[str, Any], shapes: dict[str, tuple[int, ...]], file_name: str
) -> dict[str, Any]:
    """mlx-lm's ``config.json`` for the file: the common hyper-parameters from gguf-py's
    keys, then the architecture's own (:attr:`GGUFArchitecture.extra`)."""
    arch = architecture_of(metadata, file_name)
    meta = Metadata(metadata, arch.name, file_name)
    hidden = int(meta.need(LLM.EMBEDDING_LENGTH))
    heads = meta.integer(ATTENTION.HEAD_COUNT) or int(meta.need(ATTENTION.HEAD_COUNT))
    head_dim = meta.integer(ATTENTION.KEY_LENGTH, hidden // heads)
    if meta.integer(ATTENTION.VALUE_LENGTH, head_dim) != head_dim:
        raise ModelLoadError(
            f"{file_name}: key and value heads of different sizes are not supported for {arch.name}"
        )
    layer_norm = arch.eps_name == "norm_epsilon"
    eps_key = ATTENTION.LAYERNORM_EPS if layer_norm else ATTENTION.LAYERNORM_RMS_EPS
    context = meta.integer(LLM.CONTEXT_LENGTH, 4096)
    config: dict[str, Any] = {
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int(meta.need(LLM.BLOCK_COUNT)),
        "intermediate_size": meta.integer(LLM.FEED_FORWARD_LENGTH, 0),
        "num_attention_heads": heads,
        "num_key_value_heads": meta.integer(ATTENTION.HEAD_COUNT_KV, heads),
        "head_dim": head_dim,
        arch.eps_name: float(meta.need(eps_key)),
        "vocab_size": _vocab_size(meta, shapes),
        "rope_theta": float(meta.get(ROPE.FREQ_BASE, 10_000.0)),
        "max_position_embeddings": context,
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": "blk.0.attn_q.bias" in shapes,
        "mlp_bias": "blk.0.ffn_up.bias" in shapes,
        "rope_scaling": _rope_scaling(meta),
    }
    config.update(arch.extra(meta, config, shapes))
    return config


def _vocab_size(meta: Metadata, shapes: dict[str, tuple[int, ...]]) -> int:
    if "token_embd.weight" in shapes:
        return int(shapes["token_embd.weight"][0])
    return int(meta.get(LLM.VOCAB_SIZE) or len(meta.raw.get(Keys.Tokenizer.LIST, [])))


def _rope_scaling(meta: Metadata) -> dict[str, Any] | None:
    """``rope_scaling`` as mlx-lm's ``initialize_rope`` reads it; llama3's comes from the
    ``rope_freqs`` tensor instead (:mod:`core.models.load.gguf_names`)."""
    kind = meta.get(ROPE.SCALING_TYPE)
    if kind in (None, "none"):
        return None
    factor = float(meta.need(ROPE.SCALING_FACTOR))
    if kind == "linear":
        return {"type": "linear", "factor": factor}
    if kind == "yarn":
        scaling: dict[str, Any] = {
            "type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": meta.integer(ROPE.SCALING_ORIG_CTX_LEN),
        }
        for key, name in (
            (ROPE.SCALING_YARN_BETA_FAST, "beta_fast"),
            (ROPE.SCALING_YARN_BETA_SLOW, "beta_slow"),
        ):
            if meta.get(key) is not None:
                scaling[name] = float(meta.get(key))
        return scaling
    raise ModelLoadError(
        f"{meta.file_name}: RoPE scaling {kind!r} is not supported for {meta.arch}"
    )
