"""How a model's per-token states become one embedding: what its files say, else the mean.

A dedicated embedding model says how it pools: a sentence-transformers folder in its
``modules.json`` and its Pooling module's ``config.json`` (usually ``1_Pooling/``:
``pooling_mode_mean_tokens``, ``pooling_mode_cls_token``, ``pooling_mode_lasttoken``), a
GGUF file in ``<arch>.pooling_type`` (llama.cpp's numbering: 1 mean, 2 cls, 3 last). A
chat model says nothing and is mean-pooled, as llama.cpp's ``--pooling mean`` does.

RadixChat runs every model through mlx-lm's class for its architecture, which is causal.
What it cannot run as its authors meant is refused, with why, rather than served
different vectors: a model that attends both ways (``use_bidirectional_attention``, or
``is_causal: false``; a GGUF's ``<arch>.attention.causal`` false), a sentence-transformers
pipeline with a module past pooling other than ``Normalize`` (a ``Dense`` projection, a
``LayerNorm``...), pooling by the maximum, a weighted or square-root-scaled mean, several
modes at once, or a reranker (GGUF ``pooling_type`` 4). Nothing here imports mlx.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ModelLoadError

POOLING_MODES = ("mean", "cls", "last")
# sentence-transformers' Pooling config keys, by the mode they name (None: not run here)
_ST_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_max_tokens": None,
    "pooling_mode_mean_sqrt_len_tokens": None,
    "pooling_mode_weightedmean_tokens": None,
}
# the sentence-transformers modules a pipeline may have here: the model itself, the
# pooling, and the normalisation every embedding gets anyway
_ST_RUN = ("Transformer", "Pooling", "Normalize")
_GGUF_MODES = {0: "mean", 1: "mean", 2: "cls", 3: "last"}  # 0: none said (per-token)


@dataclass(frozen=True)
class Pooling:
    """How one model's embeddings are pooled: ``mode`` one of :data:`POOLING_MODES`;
    ``source`` where that was read ("default": nothing said it); ``refused``: why this
    model's embeddings are not served (one line), else None."""

    mode: str = "mean"
    source: str = "default"
    refused: str | None = None


def pooling_of(path: str | Path, config: dict[str, Any]) -> Pooling:
    """The pooling of the model loaded from ``path`` (a model folder or a ``.gguf`` file),
    whose ``config.json`` (or GGUF-built config) is ``config``."""
    path = Path(path)
    if path.is_file():
        try:
            stat = path.stat()
        except OSError as exc:
            return Pooling(refused=f"{path.name} cannot be read: {exc}")
        return _gguf_pooling(str(path), stat.st_size, stat.st_mtime_ns)
    if config.get("use_bidirectional_attention") or config.get("is_causal") is False:
        return _bidirectional("config.json", config)
    return _folder_pooling(path)


def _bidirectional(source: str, config: dict[str, Any]) -> Pooling:
    kind = config.get("model_type") or "its architecture"
    return Pooling(
        source=source,
        refused=f"this model attends both ways ({source} says so), but mlx-lm's {kind} "
        "runs causally: its embeddings would not be the ones it was trained to give",
    )


def _folder_pooling(folder: Path) -> Pooling:
    modules = _json(folder / "modules.json")
    pooling_dir = "1_Pooling"
    if isinstance(modules, list):
        for module in modules:
            kind = (
                str(module.get("type", "")).rsplit(".", 1)[-1] if isinstance(module, dict) else ""
            )
            if kind not in _ST_RUN:
                where = module.get("path") if isinstance(module, dict) else None
                return Pooling(
                    source="modules.json",
                    refused=f"its sentence-transformers pipeline has a {kind or 'unknown'} "
                    f"module{f' ({where})' if where else ''}, which RadixChat does not run",
                )
            if kind == "Pooling" and module.get("path"):
                pooling_dir = str(module["path"])
    source = f"{pooling_dir}/config.json"
    settings = _json(folder / pooling_dir / "config.json")
    if not isinstance(settings, dict):
        return Pooling()
    named = [key for key in _ST_MODES if settings.get(key)]
    if len(named) != 1 or _ST_MODES[named[0]] is None:
        said = ", ".join(named) or "no pooling mode"
        return Pooling(
            source=source,
            refused=f"it pools by {said} ({source}); RadixChat pools by one of the mean, the "
            "first token or the last token",
        )
    return Pooling(_ST_MODES[named[0]], source)


@functools.lru_cache(maxsize=8)
def _gguf_pooling(path: str, size: int, mtime_ns: int) -> Pooling:
    """A GGUF file's pooling (remembered by path, size and modification time: reading
    the header decodes the whole vocabulary)."""
    from core.models.load.gguf_header import read_header

    try:
        metadata = read_header(Path(path)).metadata
    except ModelLoadError as exc:
        return Pooling(refused=str(exc))
    arch = metadata.get("general.architecture")
    if metadata.get(f"{arch}.attention.causal") is False:
        return _bidirectional(f"{arch}.attention.causal", {"model_type": arch})
    key = f"{arch}.pooling_type"
    kind = metadata.get(key)
    if kind is None:
        return Pooling()
    if kind not in _GGUF_MODES:
        return Pooling(
            source=key,
            refused=f"its {key} is {kind} (4 is a reranker's): RadixChat pools by the mean, "
            "the first token or the last token",
        )
    return Pooling(_GGUF_MODES[kind], key if kind else "default")


def _json(path: Path) -> Any:
    """The JSON in ``path``; None when there is no such file or it is not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
