"""The KV page pool, its page allocator and the memory budget.

A *page* holds ``page_size`` consecutive tokens of one sequence; a *slot* names one token
place in the pool: ``slot = page_id * page_size + offset``. Page 0 is the null page: it
stays zero and is never handed out, so a zero page id can mean "no page".

In-place writes (MLX 0.32's CPU backend; measured: docs/benchmarks.md): an update of the
pool (``pool[a:b] = pages`` or a scatter ``pool[idx] = kv``) followed by ``mx.eval`` reuses
the pool's buffer, peak memory growing only by the update itself, as long as nothing else
references that buffer. Two things do, and each turns the next write into a copy of the
whole array: a live slice view of the pool
(``pool[1:3]``), and a lazy, not yet evaluated read of it. So this pool never hands out
views (every read is a gather, a fresh array) and evaluates its reads and writes before
returning.

Speed on the CPU: a scatter costs the same per element whatever its shape; a slice update
runs near memcpy speed plus a fixed cost per update, and wins even at 8-token pages
(measured: docs/benchmarks.md). So whole pages go in as slice updates, one per run of
consecutive page ids (a fresh allocator hands out consecutive ids), and only the tokens
that finish a partly filled page (``write_tokens``; decode steps) go through the scatter
of ``write_slots``.

RAM on demand: the pool is a list of *segments* of ``segment_pages`` pages each (page
``p`` lives in segment ``p // segment_pages``), allocated one at a time as the pages fill
(:meth:`KVPagePool.grow`), up to ``num_pages``: one short chat holds one segment, not the
whole budget. Reads and writes split at segment boundaries (a run of consecutive pages
rarely crosses one; a gather spanning segments gathers each run and joins them).

Quantized K/V (``kvcache.kv_format``): a side of a quantized cache is three arrays
(packed words, scales, biases), each paged as above in its own pool array; reads and
writes take and give such a side as a tuple of three, full precision as one array.
"""

from __future__ import annotations

import math
import os

import mlx.core as mx
import numpy as np

from kvcache.kv_pages import joined, parts, tokens_of
from kvcache.layout import CacheLayout, dtype_from_name

MIN_POOL_PAGES = 16  # the smallest pool the budget gives (when memory is short)
DEFAULT_MAX_POOL_BYTES = 2 << 30  # 2 GiB: ~46k tokens of SmolLM2-135M in float32


class KVPagePool:
    """K and V pages for every paged (full-attention) cache, indexed by pool index
    (``layout.paged[i]``; the docstrings say "layer" for a pool index).

    Segment ``s``, layer ``i``: a ``(segment_pages, key_heads, page_size, key_dim)`` K
    array and a ``(segment_pages, value_heads, page_size, value_dim)`` V array (keys and
    values keep their own shapes: an MLA latent and its rope part differ in width) in the
    cache's dtype, evaluated, holding pages ``s * segment_pages ..``. Without
    ``segment_pages`` the pool is one segment of all ``num_pages + 1`` pages, allocated at
    once; ``keys[i]`` / ``values[i]`` are the first segment's arrays. Invariant: page 0
    is all zeros.
    """

    def __init__(
        self, layout: CacheLayout, num_pages: int, page_size: int, segment_pages: int | None = None
    ):
        if num_pages < 0 or page_size < 1 or (segment_pages is not None and segment_pages < 1):
            raise ValueError(f"bad pool size: {num_pages} pages of {page_size} tokens")
        self.layout = layout
        self.num_pages = num_pages
        self.page_size = page_size
        self.segment_pages = min(segment_pages or num_pages + 1, num_pages + 1)
        # segment -> layer -> its arrays: the key side's parts, then the value side's
        self._segments: list[list[list[mx.array]]] = []
        # layer -> (heads, width, dtype name) of each array; how many of them are the keys'
        self._parts = []
        self._key_parts = []
        for spec in layout.paged:
            key_parts, value_parts = spec.kv_parts()
            self._parts.append(key_parts + value_parts)
            self._key_parts.append(len(key_parts))
        # head index columns (H, 1) of each layer's arrays, for gathers and scatters
        self._heads = [[mx.arange(h)[:, None] for h, _, _ in layer] for layer in self._parts]
        self.grow()

    @property
    def keys(self) -> list:
        """The first segment's keys per layer (a tuple of three arrays where quantized)."""
        return [self._side(layer, arrays, 0) for layer, arrays in enumerate(self._segments[0])]

    @property
    def values(self) -> list:
        return [self._side(layer, arrays, 1) for layer, arrays in enumerate(self._segments[0])]

    def _side(self, layer: int, arrays: list, side: int):
        k = self._key_parts[layer]
        if side == 0:
            return joined(arrays[:k], k)
        return joined(arrays[k:], len(arrays) - k)

    @property
    def num_layers(self) -> int:
        return len(self._heads)

    @property
    def reserved_pages(self) -> int:
        """Pages ``1..reserved_pages`` have memory now (the rest comes with :meth:`grow`)."""
        return min(self.num_pages, len(self._segments) * self.segment_pages - 1)

    @property
    def nbytes(self) -> int:
        """Bytes allocated now (all segments so far)."""
        return sum(a.nbytes for segment in self._segments for layer in segment for a in layer)

    @property
    def budget_bytes(self) -> int:
        """Bytes of the whole pool, once every segment is allocated."""
        return (self.num_pages + 1) * self.page_size * self.layout.bytes_per_token

    def grow(self) -> list[int]:
        """Add the next segment; returns its page ids ([] once the pool is whole).

        Segment 0 is evaluated at once (its page 0 is the null page that padded gathers
        read). A later one stays a lazy ``zeros`` until its first write evaluates it: then
        the zeros are made and updated in place in one go (the write donates them), so
        the memory is taken and touched where it is first used, not here. A restore grows
        the pool for pages whose K/V is copied in only after its request's first token
        (``PrefixCache.flush_writes``): that token no longer waits for the zeroing (its cost:
        docs/benchmarks.md)."""
        before = self.reserved_pages if self._segments else 0
        if self._segments and before >= self.num_pages:
            return []
        first = len(self._segments) * self.segment_pages
        count = min(self.segment_pages, self.num_pages + 1 - first)
        segment = [
            [
                mx.zeros((count, heads, self.page_size, width), dtype_from_name(dtype))
                for heads, width, dtype in layer
            ]
            for layer in self._parts
        ]
        if not self._segments:
            mx.eval(segment)
        self._segments.append(segment)
        return list(range(max(first, 1), self.reserved_pages + 1))

    def _arrays(self, layer: int, page: int) -> list[mx.array]:
        """The arrays of ``layer`` (key parts, then value parts) in the segment holding
        ``page``."""
        return self._segments[page // self.segment_pages][layer]

    def _inputs(self, layer: int, keys, values, n: int | None = None) -> list[mx.array]:
        """The arrays of a write's K and V (either format), checked against the layer's."""
        arrays = list(parts(keys) + parts(values))
        if len(arrays) != len(self._parts[layer]) or (len(parts(keys)) != self._key_parts[layer]):
            raise ValueError(
                f"K/V of {len(arrays)} arrays, layer {layer} stores {len(self._parts[layer])}"
            )
        n = arrays[0].shape[1] if n is None else n
        for array, (heads, width, _) in zip(arrays, self._parts[layer]):
            if array.shape != (heads, n, width):
                raise ValueError(f"K/V of shape {array.shape}, expected {(heads, n, width)}")
        return arrays

    def write(self, layer: int, page_ids: list[int], keys, values) -> None:
        """Write ``(heads, n, dim)`` K and V over whole pages ``page_ids``, in order (a
        quantized side: its three ``(heads, n, width)`` arrays).

        ``page_ids`` must be exactly the ``ceil(n / page_size)`` pages the tokens fill;
        the rest of the last page is zeroed.
        """
        self._check_pages(page_ids)
        arrays = self._inputs(layer, keys, values)
        n = arrays[0].shape[1]
        if len(page_ids) != math.ceil(n / self.page_size):
            raise ValueError(
                f"{n} tokens fill {math.ceil(n / self.page_size)} pages, not {len(page_ids)}"
            )
        touched = []
        full = n // self.page_size  # whole pages straight from the input; a partial last
        for part, kv in enumerate(arrays):  # page alone, zero-padded
            kv = kv.astype(self._arrays(layer, page_ids[0])[part].dtype)
            if full:
                pages = self._as_pages(kv[:, : full * self.page_size], full)
                # slice updates: see the module doc
                for at, first, count in self._runs(page_ids[:full]):
                    pool, local = self._arrays(layer, first)[part], first % self.segment_pages
                    pool[local : local + count] = pages[at : at + count]
                    touched.append(pool)
            if n > full * self.page_size:
                pool, local = (
                    self._arrays(layer, page_ids[full])[part],
                    page_ids[full] % self.segment_pages,
                )
                pool[local : local + 1] = self._as_pages(kv[:, full * self.page_size :], 1)
                touched.append(pool)
        mx.eval(touched)

    def _runs(self, page_ids: list[int]) -> list[tuple[int, int, int]]:
        """``page_runs``, each run also cut where a segment ends."""
        runs = []
        for at, first, count in page_runs(page_ids):
            while count:
                take = min(count, self.segment_pages - first % self.segment_pages)
                runs.append((at, first, take))
                at, first, count = at + take, first + take, count - take
        return runs

    def write_tokens(self, layer: int, page_ids: list[int], start: int, keys, values) -> None:
        """Write ``(heads, n, dim)`` K and V as tokens ``start..start+n-1`` of the
        sequence stored in ``page_ids``: the part that finishes a partly filled page
        token by token, the rest as whole pages."""
        n = parts(keys)[0].shape[1]
        head = min(n, -start % self.page_size)
        if head:
            page, size = page_ids[start // self.page_size], self.page_size
            slots = [page * size + t % size for t in range(start, start + head)]
            self.write_slots(layer, slots, tokens_of(keys, 0, head), tokens_of(values, 0, head))
        if n > head:
            first = (start + head) // self.page_size
            pages = page_ids[first : math.ceil((start + n) / self.page_size)]
            self.write(layer, pages, tokens_of(keys, head, n), tokens_of(values, head, n))

    def write_slots(self, layer: int, slots, keys, values) -> None:
        """Write ``(heads, n, dim)`` K and V token by token into ``n`` slots
        (for new tokens that start mid-page). Slots must not repeat."""
        if isinstance(slots, mx.array):
            slots = self._slots_array(slots)
            low, high = mx.min(slots), mx.max(slots)
            mx.eval(low, high)  # one sync for both
            low, high = low.item(), high.item()
        else:
            slots, low, high = self._slots_array(slots), min(slots), max(slots)
        if low < self.page_size or high >= (self.reserved_pages + 1) * self.page_size:
            raise ValueError(f"slots {low}..{high} outside pages 1..{self.reserved_pages}")
        arrays = self._inputs(layer, keys, values, slots.size)
        heads = self._heads[layer]
        touched = []
        for a, b, segment in self._segment_runs(slots, low, high):
            pages, offsets = self._split(slots[a:b], segment)
            pools = self._arrays(layer, segment * self.segment_pages)
            for pool, head, kv in zip(pools, heads, arrays):
                pool[pages, head, offsets] = kv[:, a:b].astype(pool.dtype)
            touched += pools
        mx.eval(touched)

    def gather(self, layer: int, slots) -> tuple:
        """K and V of ``slots`` as ``(1, heads, n, dim)`` arrays (a quantized side: a tuple
        of its three), evaluated and contiguous: ready for an mlx-lm ``KVCache`` or
        ``QuantizedKVCache`` (``keys``, ``values``, ``offset = n``)."""
        slots = self._slots_array(slots)
        heads = self._heads[layer]
        runs = [[] for _ in heads]
        for a, b, segment in self._segment_runs(slots):
            pages, offsets = self._split(slots[a:b], segment)
            for run, pool, head in zip(
                runs, self._arrays(layer, segment * self.segment_pages), heads
            ):
                run.append(pool[pages, head, offsets])
        arrays = [(run[0] if len(run) == 1 else mx.concatenate(run, axis=1))[None] for run in runs]
        mx.eval(arrays)  # no lazy read of the pool may outlive this call
        k = self._key_parts[layer]
        return joined(arrays[:k], k), joined(arrays[k:], len(arrays) - k)

    def _segment_runs(
        self, slots: mx.array, low: int | None = None, high: int | None = None
    ) -> list[tuple[int, int, int]]:
        """``(a, b, segment)``: ``slots[a:b]`` all lie in ``segment``, runs in order. One
        segment (the common case) costs no look at the slots."""
        if len(self._segments) == 1:
            return [(0, slots.size, 0)]
        span = self.segment_pages * self.page_size
        if low is not None and low // span == high // span:
            return [(0, slots.size, low // span)]
        segments = np.array(slots) // span
        cuts = np.flatnonzero(np.diff(segments)) + 1
        bounds = [0, *cuts.tolist(), slots.size]
        return [(a, b, int(segments[a])) for a, b in zip(bounds, bounds[1:])]

    def _split(self, slots: mx.array, segment: int = 0) -> tuple[mx.array, mx.array]:
        """Page (within ``segment``) and offset index rows ``(1, n)``; with heads ``(H, 1)``
        they broadcast to ``(H, n)`` and index ``pool[page, head, offset]`` ->
        ``(H, n, head_dim)``."""
        pages = slots // self.page_size - segment * self.segment_pages
        return pages[None], (slots % self.page_size)[None]

    def _slots_array(self, slots) -> mx.array:
        if isinstance(slots, mx.array):
            ok = slots.ndim == 1 and slots.size > 0
        else:
            ok = len(slots) > 0
            slots = mx.array(slots, dtype=mx.int32)
        if not ok or slots.ndim != 1:
            raise ValueError(f"slots must be a non-empty 1-D list, got shape {slots.shape}")
        return slots

    def _check_pages(self, page_ids: list[int]) -> None:
        if not page_ids or len(set(page_ids)) != len(page_ids):
            raise ValueError(f"page ids must be distinct and non-empty: {page_ids}")
        if min(page_ids) < 1 or max(page_ids) > self.reserved_pages:
            raise ValueError(f"page ids outside 1..{self.reserved_pages}: {page_ids}")

    def _as_pages(self, kv: mx.array, num_pages: int) -> mx.array:
        """``(H, n, D)`` -> ``(num_pages, H, page_size, D)``, zero-padding the last page."""
        heads, n, head_dim = kv.shape
        pad = num_pages * self.page_size - n
        if pad:
            kv = mx.concatenate([kv, mx.zeros((heads, pad, head_dim), kv.dtype)], axis=1)
        return kv.reshape(heads, num_pages, self.page_size, head_dim).transpose(1, 0, 2, 3)


def page_runs(page_ids: list[int]) -> list[tuple[int, int, int]]:
    """Runs of consecutive page ids as ``(position in page_ids, first page, length)``:
    ``[4, 5, 6, 2]`` -> ``[(0, 4, 3), (3, 2, 1)]``."""
    runs = []
    for at, page in enumerate(page_ids):
        if runs and page == runs[-1][1] + runs[-1][2]:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((at, page, 1))
    return runs


class PageAllocator:
    """Free list and reference counts of pages ``1..num_pages`` (page 0 is never given).

    Invariants (``check_invariants``): a page is on the free list exactly when its count
    is 0; counts are never negative; free + used == num_pages; no page is listed twice.
    """

    def __init__(self, num_pages: int, reserved: int | None = None):
        self.num_pages = num_pages  # the most there can be
        self.reserved = num_pages if reserved is None else reserved  # pages 1..reserved exist now
        self._free = list(range(self.reserved, 0, -1))  # a stack: pops 1, 2, 3, ... first
        self._refs = [0] * (num_pages + 1)

    def add_pages(self, pages: list[int]) -> None:
        """The pool grew: ``pages`` (the next ids after ``reserved``) can be handed out."""
        if pages:
            assert pages[0] == self.reserved + 1 and pages[-1] <= self.num_pages, pages
            self.reserved = pages[-1]
            self._free = sorted(pages, reverse=True) + self._free  # the free ones we had go first

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.reserved - len(self._free)

    def available(self) -> int:
        """Pages ``alloc`` can hand out now (evictable tree pages are the tree's to add)."""
        return len(self._free)

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def alloc(self, n: int) -> list[int] | None:
        """``n`` pages with count 1, or None when fewer are free (evict, then retry)."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        for page in pages:
            self._refs[page] = 1
        return pages

    def incref(self, pages: list[int]) -> None:
        for page in pages:
            assert self._refs[page] > 0, f"incref of free page {page}"
            self._refs[page] += 1

    def decref(self, pages: list[int]) -> None:
        """Drop one reference per listed page; a page reaching 0 goes back to the free list."""
        for page in pages:
            assert self._refs[page] > 0, f"decref of free page {page}"
            self._refs[page] -= 1
            if self._refs[page] == 0:
                self._free.append(page)

    def check_invariants(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "a page is on the free list twice"
        assert 0 not in free and self._refs[0] == 0, "the null page was handed out"
        assert all(r >= 0 for r in self._refs), "negative reference count"
        used = {p for p in range(1, self.num_pages + 1) if self._refs[p] > 0}
        assert not free & used, f"free pages still referenced: {sorted(free & used)}"
        assert len(free) + len(used) == self.reserved, "a page is neither free nor used"
        assert max(free | used, default=0) <= self.reserved, "a page beyond the reserved ones"


def pool_pages_for_budget(
    layout: CacheLayout,
    page_size: int,
    *,
    weight_bytes: int,
    fraction: float = 0.25,
    tokens: int | None = None,
    budget_bytes: int | None = None,
    max_bytes: int = DEFAULT_MAX_POOL_BYTES,
) -> int:
    """How many pages the pool gets.

    ``tokens`` given: ``ceil(tokens / page_size)``. ``budget_bytes`` given (the user's RAM
    budget for the pool): as many pages as fit in it, at least ``MIN_POOL_PAGES``. Otherwise the
    budget is ``fraction`` of the device's memory (``device_memory_bytes``) minus
    ``weight_bytes``, capped at ``max_bytes`` (the pool is preallocated: a desktop app should
    not take half the machine for a chat), divided by the bytes of one page over all pooled
    layers, and at least ``MIN_POOL_PAGES``. On the CPU the figure is RAM available now, which
    already excludes loaded weights: subtracting them again errs on the small side. A layout
    with nothing to page (only snapshots: a pure recurrent model) gets 0.
    """
    page_bytes = layout.bytes_per_token * page_size
    if page_bytes == 0:
        return 0
    if tokens is not None:
        return math.ceil(tokens / page_size)
    if budget_bytes is not None:
        return max(MIN_POOL_PAGES, int(budget_bytes // page_bytes))
    budget = min(fraction * device_memory_bytes() - weight_bytes, max_bytes)
    return max(MIN_POOL_PAGES, int(budget // page_bytes))


def device_memory_bytes() -> int:
    """Memory the cache may draw on: Metal's recommended working set, a GPU's total memory,
    else the host's available RAM (``MemAvailable`` in /proc/meminfo, or sysconf)."""
    info = mx.device_info()
    if "max_recommended_working_set_size" in info:
        return int(info["max_recommended_working_set_size"])
    if mx.default_device().type == mx.DeviceType.gpu:
        for key in ("total_memory", "memory_size"):
            if key in info:
                return int(info[key])
    return available_ram_bytes()


def available_ram_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    pages = (
        os.sysconf("SC_AVPHYS_PAGES")
        if "SC_AVPHYS_PAGES" in os.sysconf_names
        else os.sysconf("SC_PHYS_PAGES")
    )
    return pages * os.sysconf("SC_PAGE_SIZE")
