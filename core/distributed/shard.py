"""Which models a group can split, and splitting one as it loads.

Two splits, both mlx-lm's:

- **tensor parallel** (``Model.shard(group)``): every rank holds its share of each layer's
  attention heads and MLP columns, and the layers' outputs are summed over the group
  (``all_sum``) inside the forward. It needs the architecture to have ``shard`` and the
  head counts and MLP width to divide by the number of ranks.
- **pipeline** (``PipelineMixin.pipeline(group)``, for the architectures that have it):
  every rank holds whole layers, a run of them (rank 0 the last ones); the hidden state
  goes from rank to rank (``send``/``recv``), and the last rank's output is gathered on
  every rank. It needs at least as many layers as ranks.

``"auto"`` takes tensor parallel where it can split the model (a collective per layer, but
every rank works on every token), else the pipeline. Both are read from the model's config
(``config.json``, or a GGUF file's header) before any weight is read, so a model the group
cannot split is refused in one line at once, not after minutes of loading.

The cache of a split model holds this rank's heads (tensor) or layers (pipeline) only: its
pages are this rank's, and so is its disk store, whose fingerprint names the split, the
rank and the group's size (:func:`rank_fingerprint`): the slice saved by rank 1 of 2 is
never read by another rank or another split of the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ModelLoadError, UserError
from core.models.load.gguf_architectures import ARCHITECTURES

TENSOR, PIPELINE = "tensor", "pipeline"
SPLITS = ("auto", TENSOR, PIPELINE)  # what a user may ask for (``--split``)


class UnsplittableModel(UserError):
    """A model the group cannot split (no split in mlx-lm, heads that do not divide...)."""


@dataclass(frozen=True)
class SplitPlan:
    """How a model splits over ``world`` ranks (plain values)."""

    model_type: str
    world: int
    heads: int
    kv_heads: int
    method: str = TENSOR  # TENSOR | PIPELINE
    layers: int = 0  # the model's layers (a pipeline shares them out)

    def describe(self) -> str:
        """What each rank holds, for the start-up line."""
        if self.method == PIPELINE:
            low, high = self.layers // self.world, -(-self.layers // self.world)
            share = f"{low}" if low == high else f"{low} or {high}"
            return f"pipelined: {share} of {self.layers} layers each"
        return f"{self.kv_heads // self.world} of {self.kv_heads} KV heads each"


def model_config(path: Path) -> dict[str, Any]:
    """The config of the model at ``path`` (an MLX folder or a ``.gguf`` file), weights unread."""
    if path.is_file() and path.suffix.lower() == ".gguf":
        from core.models.load.gguf_header import read_header

        meta = read_header(path).metadata
        arch = str(meta.get("general.architecture", ""))
        heads = meta.get(f"{arch}.attention.head_count")
        return {
            "model_type": ARCHITECTURES[arch].model_type if arch in ARCHITECTURES else arch,
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


def split_plan(config: dict[str, Any], world: int, name: str, split: str = "auto") -> SplitPlan:
    """How ``config``'s model splits over ``world`` ranks (``split``: "auto", "tensor" or
    "pipeline"), or :class:`UnsplittableModel` saying in one line why it cannot."""
    text = config.get("text_config") or {}
    model_type = str(config.get("model_type") or text.get("model_type") or "")

    def count(key: str) -> int | None:
        value = config.get(key, text.get(key))
        return int(value) if value else None

    heads = count("num_attention_heads")
    kv_heads = count("num_key_value_heads") or heads
    layers = count("num_hidden_layers") or 0
    model_class = _model_class(config)
    tensor = model_class is not None and hasattr(model_class, "shard")
    pipeline = _has_pipeline(config)
    plan = SplitPlan(model_type, world, heads or 0, kv_heads or 0, TENSOR, layers)
    if split == PIPELINE or (split == "auto" and pipeline and not tensor):
        if not pipeline:
            raise UnsplittableModel(
                f"{name} cannot run pipelined: mlx-lm has no pipeline split for model type "
                f"{model_type!r} (qwen2, qwen3_moe, qwen3_next, deepseek_v3 and other "
                "architectures with a `pipeline` method do)"
            )
        if layers < world:
            raise UnsplittableModel(
                f"{name} cannot be pipelined over {world} machines: it has only {layers} layers"
            )
        return dataclasses.replace(plan, method=PIPELINE)
    if not tensor:
        by_layers = (
            ""
            if split == TENSOR
            else "; qwen2, qwen3_next, deepseek_v3 and others with `pipeline` by layers"
        )
        raise UnsplittableModel(
            f"{name} cannot run over several machines: mlx-lm has no tensor-parallel "
            f"{'split' if split == TENSOR else 'or pipeline split'} for model type "
            f"{model_type!r} (llama, qwen2, qwen3 and other architectures with a `shard` method "
            f"split by heads{by_layers})"
        )
    ffn = count("intermediate_size")
    for label, value in (("attention heads", heads), ("KV heads", kv_heads), ("MLP width", ffn)):
        if value is not None and value % world:
            if split == "auto" and pipeline and layers >= world:
                return dataclasses.replace(plan, method=PIPELINE)
            raise UnsplittableModel(
                (
                    f"{name} cannot be split over {world} machines: its {value} {label} do not "
                    f"divide by {world}"
                )
                + (
                    " (and mlx-lm has no pipeline split for it)"
                    if split == "auto" and not pipeline
                    else ""
                )
            )
    return plan


def _has_pipeline(config: dict[str, Any]) -> bool:
    """Whether mlx-lm's module for ``config`` has a pipelined model (a ``PipelineMixin``)."""
    from core.mlx_lm_compat import has_pipeline

    model_class = _model_class(config)
    return model_class is not None and has_pipeline(model_class)


def _model_class(config: dict[str, Any]):
    """The mlx-lm ``Model`` class for ``config`` (None: mlx-lm has no such architecture)."""
    from core.mlx_lm_compat import model_class

    model_type = config.get("model_type") or (config.get("text_config") or {}).get("model_type")
    return model_class(model_type) if model_type else None


def shard_model(model, group, method: str = TENSOR) -> None:
    """Cut ``model`` (weights still lazy) to this rank's part of ``group``'s split: its heads
    (tensor) or its layers (pipeline; the others become None and are never read)."""
    if method != PIPELINE:
        model.shard(group)
        return
    for path in (("model",), ("language_model", "model")):  # where mlx-lm keeps the pipelined part
        part = model
        for name in path:
            part = getattr(part, name, None)
        if part is not None and hasattr(part, "pipeline"):
            part.pipeline(group)
            return
    raise ModelLoadError(
        f"{type(model).__module__}: no pipelined part found (model.model.pipeline)"
    )


def rank_fingerprint(fingerprint: str, rank: int, world: int, method: str = TENSOR) -> str:
    """The fingerprint of rank ``rank``'s slice of a model split ``method``-wise over ``world``
    ranks."""
    kind = "tensor-parallel" if method == TENSOR else method
    return hashlib.sha256(f"{fingerprint}/{kind}/rank {rank} of {world}".encode()).hexdigest()


def rank_cache_name(rank: int, world: int) -> str:
    """The file name of rank ``rank``'s disk cache (ranks on one machine share a data folder)."""
    return f"kvcache-rank{rank}of{world}.db"


_RANK_CACHE = re.compile(r"kvcache-rank(\d+)of(\d+)\.db")


def rank_cache_stores(root: Path) -> list[tuple[str, Path]]:
    """The ranks' disk caches in the data folder ``root`` as ``("rank1of2", path)``, by
    group size, then rank."""
    found = []
    for path in root.glob("kvcache-rank*of*.db"):
        match = _RANK_CACHE.fullmatch(path.name)
        if match:
            rank, world = int(match[1]), int(match[2])
            found.append(((world, rank), (f"rank{rank}of{world}", path)))
    return [store for _, store in sorted(found)]
