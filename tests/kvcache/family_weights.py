"""Weights for the tiny configs of :mod:`tests.kvcache.model_families`: mlx-lm's own
initialisation of each model type, with seeded noise on what starts constant, recurrent
decays made slow and an output head with clear greedy winners (why: that module's
docstring); ``write_family(path, name)`` writes a loadable model folder."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from core.models.tiny_model import EOS_TOKEN_IDS, VOCAB_SIZE, write_tokenizer_files
from tests.kvcache.model_families import BASE, FAMILIES

NOISE = 0.05  # relative size of the noise on parameters that start constant
EMBED_GAIN = 4.0  # logits of std ~4: clear greedy winners


def config_for(name: str, **overrides) -> dict:
    """The ``config.json`` of family ``name``'s tiny model (``overrides`` on top)."""
    config = {**BASE, "model_type": name, **FAMILIES[name], **overrides}
    config["eos_token_id"] = EOS_TOKEN_IDS
    return config


def build_model(name: str, seed: int = 0, **overrides):
    """Family ``name``'s tiny model, weights as :func:`family_weights` makes them
    (``overrides`` on top of the config)."""
    model = _initialised(config_for(name, **overrides), seed)
    model.update(_tree(family_weights(model, seed)))
    return model


# Recurrent decays made slow, as trained models have them (a random init forgets within a
# token or two, and a lost state would then change nothing): (name ends with, the value's
# range). Mamba / gated-delta: decay exp(-exp(A_log) * softplus(dt + dt_bias)) per token;
# RWKV-7: decay exp(-0.61 * sigmoid(w bias)), and its in-context rate sigmoid(a bias) erases
# the state; RG-LRU: exp(-8 * gate * softplus(recurrent_param)).
SLOW_DECAY = (
    ("A_log", (math.log(0.02), math.log(0.2))),
    ("w_lora.lora.2.bias", (-6.0, -4.0)),
    ("a_lora.lora.2.bias", (-6.0, -4.0)),
    ("recurrent_param", (-6.0, -4.0)),
)


def family_weights(model, seed: int = 0) -> dict[str, mx.array]:
    """``model``'s own initial parameters, those that start constant given noise, recurrent
    decays made slow (``SLOW_DECAY``), an untied output head scaled by ``EMBED_GAIN`` with
    rows only for printable ASCII and newline (as :mod:`core.models.tiny_model` does: greedy
    replies are readable text, so a chat's history re-tokenises to the tokens generated)."""
    params = dict(tree_flatten(model.parameters()))
    keys = mx.random.split(mx.random.key(seed), len(params))
    weights = {}
    for key, (name, value) in zip(keys, sorted(params.items())):
        slow = next((span for suffix, span in SLOW_DECAY if name.endswith(suffix)), None)
        if slow is not None:
            value = mx.random.uniform(*slow, value.shape, key=key).astype(value.dtype)
        elif mx.issubdtype(value.dtype, mx.floating):
            if value.size > 1 and mx.all(value == value.reshape(-1)[0]).item():
                scale = max(abs(value.reshape(-1)[0].item()), 1.0)
                value = value + NOISE * scale * mx.random.normal(value.shape, key=key).astype(
                    value.dtype
                )
            elif value.size == 1:
                value = value + NOISE * mx.random.normal(value.shape, key=key).astype(value.dtype)
            if _is_head(name):  # readable replies: only printable ASCII and newline get logits
                value = (
                    value
                    * (EMBED_GAIN / max(_rms(value), 1e-6))
                    * _emittable(value.shape[0])[:, None]
                )
            elif (
                name.endswith("embed_tokens.weight") and value.shape[0] > VOCAB_SIZE
            ):  # a tied head
                value = (
                    value * (mx.arange(value.shape[0]) < VOCAB_SIZE)[:, None]
                )  # no ids past the tokenizer's
        weights[name] = value
    mx.eval(weights)
    return weights


def write_family(path: Path, name: str, seed: int = 0, **overrides) -> Path:
    """A loadable model folder of family ``name`` at ``path`` (config, weights, tokenizer;
    ``overrides`` on top of the config)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = config_for(name, **overrides)
    model = _initialised(config, seed)
    mx.save_safetensors(
        str(path / "model.safetensors"), family_weights(model, seed), metadata={"format": "mlx"}
    )
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    write_tokenizer_files(path, config["max_position_embeddings"])
    return path


HEADS = ("lm_head", "embed_out", "output")  # output heads (input embeddings keep mlx's small init)


def _initialised(config: dict, seed: int):
    """The mlx-lm model of ``config`` with its own initial weights, drawn after seeding
    MLX's global random state with ``seed``: the same config and seed, the same model."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    return model


def _is_head(name: str) -> bool:
    """The embedding table or output head (their scale sets the logits' spread): not inside
    a layer."""
    parts = name.split(".")
    return (
        parts[-1] == "weight"
        and len(parts) > 1
        and parts[-2] in HEADS
        and not any(p.isdigit() for p in parts)
    )


def _emittable(rows: int) -> mx.array:
    """1 for the ids an output head favours (printable ASCII and newline), else 0 (the
    special tokens, and ids past the tokenizer's for a family that needs a larger vocabulary)."""
    return mx.array([float(i == 10 or 32 <= i <= 126) for i in range(rows)])


def _rms(value: mx.array) -> float:
    return math.sqrt(mx.mean(value.astype(mx.float32) ** 2).item()) * math.sqrt(value.shape[-1])


def _tree(flat: dict[str, mx.array]):
    from mlx.utils import tree_unflatten

    return tree_unflatten(list(flat.items()))
