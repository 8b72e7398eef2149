"""The KV format: how full-attention K/V are stored in the pool, the tree and on disk.

At full precision (the default) a paged cache keeps its keys and values in the dtype the
model computes in. Quantized (``--kv-bits 8|4``, ``--kv-group-size``), they are kept as
MLX's affine quantization, the scheme of mlx-lm's ``QuantizedKVCache``: ``mx.quantize``
makes, for every token and head, packed ``uint32`` words, one scale and one bias per
group of ``group_size`` values along the head dimension. A token's quantized K/V depend
on that token alone, so the pages a request writes are the bytes a from-scratch request
at the same format makes, and a cached prefix gives the answer an uncached one does.

The pool keeps the three arrays of each side as they are; a request's caches are
``QuantizedKVCache`` objects built from those pages, so mlx-lm's models attend through
``quantized_scaled_dot_product_attention``; the disk tier writes and reads the same bytes.

Where it does not apply, a cache keeps its own format (``kvcache.kv_pages.formats_by_kind``
says so):

- sliding-window caches (``RotatingKVCache``): mlx-lm has no quantized rotating cache;
- recurrent / linear-attention state (``ArraysCache``...): not K/V;
- a full-attention cache whose head dimension the group size does not divide;
- a model whose attention does not take a quantized cache (a trial forward fails): all of
  its caches stay at full precision (``CacheLayout.describe`` notes why).
"""

from __future__ import annotations

from dataclasses import dataclass

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 64  # mlx-lm's default for QuantizedKVCache


@dataclass(frozen=True)
class KVFormat:
    """``bits`` None: full precision; else 8 or 4 bits in groups of ``group_size``."""

    bits: int | None = None
    group_size: int = DEFAULT_GROUP_SIZE

    def __post_init__(self) -> None:
        if self.bits is not None and self.bits not in BITS:
            raise ValueError(f"KV bits must be one of {', '.join(map(str, BITS))}, not {self.bits}")
        if self.group_size not in GROUP_SIZES:
            raise ValueError(
                f"KV group size must be one of {', '.join(map(str, GROUP_SIZES))}, "
                f"not {self.group_size}"
            )

    @property
    def quantized(self) -> bool:
        return self.bits is not None

    @property
    def tag(self) -> str:
        """What the disk store's fingerprint adds for this format ('' at full precision, so
        a store written before the KV format existed stays readable)."""
        return f"kv-q{self.bits}g{self.group_size}" if self.quantized else ""

    def describe(self) -> str:
        return f"{self.bits}-bit (group {self.group_size})" if self.quantized else "full precision"


FULL_PRECISION = KVFormat()
