"""How much memory a model's ``config.json`` implies, checked against the machine before
anything is built: a config that asks for the impossible (``num_hidden_layers: 100000``,
``hidden_size: 65536``) is refused in a moment instead of after minutes of allocating.

The estimate is a lower bound on the weights alone (tied embeddings, the smaller of a
gated or plain MLP, one expert, the bytes per weight at the precision they will be held
in): a config refused here could never have loaded; one that passes may still be too big
once the KV pool is added, which the pool's own budget handles.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from core.errors import ModelLoadError

_BYTES_PER_WEIGHT = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}


@dataclass(frozen=True)
class Estimate:
    weights: int  # how many weights, at least
    nbytes: int  # their bytes at the precision they will be held in, at least


def machine_memory() -> int:
    """The machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def estimate_weights(config: dict[str, Any], weights_format: str = "stored") -> Estimate:
    """A lower bound on the weights a config implies (see the module's note)."""
    text = (
        {**config, **(config.get("text_config") or {})}
        if isinstance(config.get("text_config"), dict)
        else config
    )
    hidden = _count(text, "hidden_size", "n_embd", "d_model")
    layers = _count(text, "num_hidden_layers", "n_layer", "num_layers")
    vocab = _count(text, "vocab_size", default=1)
    heads = _count(text, "num_attention_heads", "n_head", default=1)
    kv_heads = _count(text, "num_key_value_heads", default=heads)
    head_dim = _count(text, "head_dim", default=max(1, hidden // heads))
    intermediate = _count(text, "intermediate_size", "n_inner", "ffn_dim", default=hidden)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o; k, v
    mlp = 2 * hidden * intermediate  # up and down (a gated MLP has a third)
    weights = vocab * hidden + layers * (attention + mlp)
    bits = (
        (config.get("quantization") or {}).get("bits")
        if isinstance(config.get("quantization"), dict)
        else None
    )
    per_weight = _BYTES_PER_WEIGHT.get(weights_format)
    if per_weight is None:  # as stored: quantized bits, else at least half precision
        per_weight = bits / 8 if isinstance(bits, int) and 0 < bits <= 16 else 2.0
    return Estimate(weights, int(weights * per_weight))


def check_fits(
    config: Any, where: str, weights_format: str = "stored", memory: int | None = None
) -> Estimate:
    """Refuse a config that is not a JSON object, or whose weights alone exceed the
    machine's memory (``memory``, default: physical RAM)."""
    if not isinstance(config, dict):
        raise ModelLoadError(f"{where} must hold a JSON object, not a JSON {_json_kind(config)}")
    estimate = estimate_weights(config, weights_format)
    memory = machine_memory() if memory is None else memory
    if estimate.nbytes > memory:
        raise ModelLoadError(
            f"{where} describes a model of at least {estimate.weights / 1e9:.3g} billion weights "
            f"({estimate.nbytes / 2**30:,.0f} GiB), more than this machine's "
            f"{memory / 2**30:,.0f} GiB of memory; nothing was loaded"
        )
    return estimate


def _count(config: dict[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        if key in config and config[key] is not None:
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelLoadError(
                    f"config.json: {key} must be a positive whole number, not {value!r}"
                )
            return value
    if default is None:
        raise ModelLoadError(f"config.json has no {keys[0]}")
    return default


def _json_kind(value: Any) -> str:
    return {
        list: "list",
        str: "string",
        int: "number",
        float: "number",
        bool: "boolean",
        type(None): "null",
    }.get(type(value), type(value).__name__)
