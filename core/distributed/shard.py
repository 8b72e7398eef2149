"""Which models a group can split, and splitting one as it loads.

A model runs over a group with mlx-lm's tensor parallelism (``Model.shard(group)``): every
rank holds its share of each layer's attention heads and MLP columns, and the layers'
outputs are summed over the group (``all_sum``) inside the forward. That needs the mlx-lm
architecture to have ``shard`` and the head counts and MLP width to divide by the number
of ranks. Both are read from the model's config (``config.json``, or a GGUF file's
header) before any weight is read, so a model the group cannot split is refused in one
line at once, not after minutes of loading.

The cache of a sharded model holds this rank's heads only: its pages are this rank's, and
so is its disk store, whose fingerprint names the rank and the group's size
(:func:`rank_fingerprint`): the slice saved by rank 1 of 2 is never read by another rank or
another split of the model.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ModelLoadError, UserError

# GGUF architecture names whose mlx-lm model type differs
_GGUF_MODEL_TYPES = {"gemma3": "gemma3_text"}


class UnsplittableModel(UserError):
    """A model the group cannot split (no tensor-parallel split, heads that do not divide)."""


@dataclass(frozen=True)
class SplitPlan:
    """How a model splits over ``world`` ranks (plain values)."""

    model_type: str
    world: int
    heads: int
    kv_heads: int


def model_config(path: Path) -> dict[str, Any]:
    """The config of the model at ``path`` (an MLX folder or a ``.gguf`` file), weights unread."""
    if path.is_file() and path.suffix.lower() == ".gguf":
        from core.models.gguf_header import read_header

        meta = read_header(path).metadata
        arch = str(meta.get("general.architecture", ""))
        heads = meta.get(f"{arch}.attention.head_count")
        return {
            "model_type": _GGUF_MODEL_TYPES.get(arch, arch),
            "num_attention_heads": heads,
            "num_key_value_heads": meta.get(f"{arch}.attention.head_count_kv") or heads,
            "intermediate_size": meta.get(f"{arch}.feed_forward_length"),
        }
    config_file = path / "config.json"
    try:
        return json.loads(config_file.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path} has no config.json: not an MLX model folder") from None
    except ValueError as exc:
        raise ModelLoadError(f"{config_file} is not valid JSON: {exc}") from exc


def split_plan(config: dict[str, Any], world: int, name: str) -> SplitPlan:
    """How ``config``'s model splits over ``world`` ranks, or :class:`UnsplittableModel`
    saying in one line why it cannot."""
    text = config.get("text_config") or {}
    model_type = str(config.get("model_type") or text.get("model_type") or "")
    model_class = _model_class(config)
    if model_class is None or not hasattr(model_class, "shard"):
        raise UnsplittableModel(
            f"{name} cannot run over several machines: mlx-lm has no tensor-parallel split for "
            f"model type {model_type!r} (llama, qwen2, qwen3 and other architectures with a "
            f"`shard` method can)")

    def count(key: str) -> int | None:
        value = config.get(key, text.get(key))
        return int(value) if value else None

    heads = count("num_attention_heads")
    kv_heads = count("num_key_value_heads") or heads
    ffn = count("intermediate_size")
    for label, value in (("attention heads", heads), ("KV heads", kv_heads), ("MLP width", ffn)):
        if value is not None and value % world:
            raise UnsplittableModel(
                f"{name} cannot be split over {world} machines: its {value} {label} do not divide by {world}")
    return SplitPlan(model_type, world, heads or 0, kv_heads or 0)


def _model_class(config: dict[str, Any]):
    """The mlx-lm ``Model`` class for ``config`` (None: mlx-lm has no such architecture)."""
    from mlx_lm.utils import MODEL_REMAPPING

    model_type = config.get("model_type") or (config.get("text_config") or {}).get("model_type")
    if not model_type:
        return None
    model_type = MODEL_REMAPPING.get(model_type, model_type)
    try:
        return importlib.import_module(f"mlx_lm.models.{model_type}").Model
    except (ImportError, AttributeError):
        return None


def shard_model(model, group) -> None:
    """Cut ``model`` (weights still lazy) to this rank's part of ``group``'s split."""
    model.shard(group)


def rank_fingerprint(fingerprint: str, rank: int, world: int) -> str:
    """The fingerprint of rank ``rank``'s slice of a model split over ``world`` ranks."""
    return hashlib.sha256(f"{fingerprint}/tensor-parallel/rank {rank} of {world}".encode()).hexdigest()


def rank_cache_name(rank: int, world: int) -> str:
    """The file name of rank ``rank``'s disk cache (ranks on one machine share a data folder)."""
    return f"kvcache-rank{rank}of{world}.db"
