"""Searching the Hugging Face hub: models with MLX weights or GGUF files matching a query,
each with what the hub says of it (downloads, parameters, quantization, size, family) and
whether it fits this machine.

The cards come as huggingface_hub's ``HfApi.list_models`` asks for them, and each is read as
it reads them; a figure that cannot be right is left out rather than believed, and a card
that cannot be read at all costs only itself.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from core.models.catalog import GGUF_BITS_PER_WEIGHT
from core.models.hub.client import (
    HubError,
    check_online,
    check_repo_id,
    endpoint,
    gguf_architectures,
    hub_error,
    mlx_lm_supports,
    quantization_of,
    request_headers,
)
from core.models.hub.fit import Fit, estimate_fit

log = logging.getLogger(__name__)

MLX_BITS = (2, 3, 4, 5, 6, 8)  # what mlx quantizes to
_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "BOOL": 1,
    "I64": 8,
    "U64": 8,
}


@dataclass(frozen=True)
class SearchResult:
    repo_id: str
    kind: str  # "mlx" | "gguf"
    downloads: int
    parameters: int | None  # as loaded (a packed 4-bit matrix counts all its weights)
    quantization: str | None  # "4bit", "Q4_K_M"...
    size_bytes: int | None  # the weights on disk, when the hub says
    fit: Fit | None
    gated: bool = False
    architecture: str | None = None
    problem: str | None = None  # why it cannot be downloaded (an unsupported family), else None


def search(
    query: str, limit: int = 20, on_cpu: bool | None = None, machine_bytes: int | None = None
) -> list[SearchResult]:
    """Models matching ``query`` with MLX weights (``mlx-community`` first) and GGUF files,
    each sorted by downloads, with whether each fits this machine. A result the hub sends
    malformed costs only itself: it is left out, or shown without the figure that is wrong."""
    query = (query or "").strip()
    if not query:
        raise HubError("search for something: a model name such as qwen3 or llama-3.2")
    check_online()
    results: dict[str, SearchResult] = {}
    try:
        for tag in ("mlx", "gguf"):
            for card in _search_cards(query, tag, limit):
                result = _read_card(card, tag, on_cpu, machine_bytes)
                if result is not None and result.repo_id not in results:
                    results[result.repo_id] = result
    except Exception as exc:
        raise hub_error(exc) from None
    return sorted(
        results.values(),
        key=lambda r: (r.kind != "mlx", not r.repo_id.startswith("mlx-community/"), -r.downloads),
    )


def _search_cards(query: str, tag: str, limit: int):
    """The hub's cards (plain JSON) for a search: what ``HfApi.list_models`` asks for and
    pages through (``GET /api/models``, its headers and token), before it reads each card
    into a ``ModelInfo``: there one card it cannot read ends the whole listing."""
    from itertools import islice

    from huggingface_hub.utils import paginate

    params = {
        "search": query,
        "filter": [tag],
        "sort": "downloads",
        "limit": limit,
        "expand": ["downloads", "gated", "safetensors", "gguf", "config", "tags", "library_name"],
    }
    return islice(
        paginate(f"{endpoint()}/api/models", params=params, headers=request_headers()), limit
    )


def _read_card(
    card: object, kind: str, on_cpu: bool | None, machine_bytes: int | None
) -> SearchResult | None:
    """One card as a result (read as ``list_models`` reads it), or None, logged, when the
    hub sent it malformed past reading."""
    from huggingface_hub.hf_api import ModelInfo

    try:
        if not isinstance(card, dict):
            raise TypeError(f"a card that is not an object: {str(card)[:80]!r}")
        info = ModelInfo(**{"siblings": None, **card})
        if not isinstance(info.id, str):
            raise TypeError(f"an id that is not text: {info.id!r}")
        check_repo_id(info.id)
        return _search_result(info, kind, on_cpu, machine_bytes)
    except (HubError, KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:
        log.warning(
            "left out a search result the hub sent malformed (%s: %s)", type(exc).__name__, exc
        )
        return None


def _search_result(info, kind: str, on_cpu: bool | None, machine_bytes: int | None) -> SearchResult:
    """A result from what the hub says of a repo; a figure that cannot be right (a count
    that is not a positive whole number, bits outside what MLX quantizes to, an
    architecture that is not a name) is left out rather than believed."""
    quantization = quantization_of(info.id)
    config = info.config if isinstance(info.config, dict) else {}
    architecture = config.get("model_type")
    if kind == "mlx":
        counts = _parameter_counts(info.safetensors.parameters if info.safetensors else None)
        size = _plausible(
            sum(n * _DTYPE_BYTES.get(dtype.upper(), 2) for dtype, n in counts.items())
        )
        bits = _bits(config, info.id)
        # quantized weights, 32 // bits a word
        packed = any(dtype.upper() == "U32" for dtype in counts)
        parameters = (
            None
            if packed and bits is None
            else _plausible(
                sum(
                    n * (32 // bits if dtype.upper() == "U32" else 1) for dtype, n in counts.items()
                )
            )
        )
        if bits is not None and quantization is None:
            quantization = f"{bits}bit"
        architecture = architecture if isinstance(architecture, str) else None
        problem = (
            None
            if architecture is None or mlx_lm_supports(architecture)
            else f"a {architecture} model, which mlx-lm can't load"
        )
        fit = estimate_fit("hf-cache", size, parameters, on_cpu, machine_bytes) if size else None
    else:
        gguf = info.gguf if isinstance(info.gguf, dict) else {}
        parameters = _plausible(gguf.get("total"))
        architecture = (
            gguf.get("architecture") if isinstance(gguf.get("architecture"), str) else None
        )
        # until a file is chosen
        size = int(parameters * GGUF_BITS_PER_WEIGHT / 8) if parameters else None
        problem = (
            None
            if architecture is None or architecture in gguf_architectures()
            else f"a GGUF of the {architecture} family, which RadixChat's import can't map yet"
        )
        fit = estimate_fit("gguf", size, parameters, on_cpu, machine_bytes) if size else None
    downloads = info.downloads if _is_count(info.downloads) else 0
    return SearchResult(
        info.id,
        kind,
        downloads,
        parameters,
        quantization,
        size,
        fit,
        gated=bool(info.gated),
        architecture=architecture,
        problem=problem,
    )


MAX_PARAMETERS = 10**14  # a hundred times the largest models: a count past it is not believed


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _plausible(value: object) -> int | None:
    """A positive count of weights or bytes the hub stated, or None where it cannot be one."""
    return value if _is_count(value) and 0 < value <= MAX_PARAMETERS * 8 else None


def _parameter_counts(counts: object) -> dict[str, int]:
    """The hub's weights per dtype, keeping only entries that are a dtype and a count."""
    if not isinstance(counts, dict):
        return {}
    return {dtype: n for dtype, n in counts.items() if isinstance(dtype, str) and _plausible(n)}


def _bits(config: dict, repo_id: str) -> int | None:
    """The bits per weight of a quantized MLX model (its config, else its name), None when
    neither says a width MLX quantizes to."""
    quantization = config.get("quantization") or config.get("quantization_config") or {}
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    if _is_count(bits) and bits in MLX_BITS:
        return bits
    match = re.search(r"(\d+)-?bit", repo_id, re.IGNORECASE)
    return int(match.group(1)) if match and int(match.group(1)) in MLX_BITS else None
