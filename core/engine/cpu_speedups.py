"""A cheaper forward pass on MLX's CPU backend, computing the same numbers.

On the CPU a decode step of the default model (30 layers, 1 to 8 rows) is about two
thirds OpenBLAS GEMMs, which mlx-lm and we call alike on the same weights. The rest is
thousands of small operations that MLX schedules one by one on its stream thread, after
the engine thread has built and dispatched each of them: on two cores that thread's work
competes with the GEMMs'. mlx-lm's models write those operations for any backend, and on
the CPU several of them fall back to compositions of many. The changes below, applied to
the loaded model on the engine thread, leave far fewer operations a step. With the OpenBLAS
kernels they were measured on (AVX-512) they changed no bit of any result; they are other
computations of the same numbers, though (a GEMM over more rows, a compiled kernel), and
with another kernel family (``OPENBLAS_CORETYPE=Prescott``) the folded attention's last
bit moves. So they are tested (``tests/core/engine/test_cpu_speedups.py``) to agree with
mlx-lm's own forward within float32 rounding and to choose the same greedy tokens,
prefilling and decoding, alone and batched, under every kernel family CI runs.

* **Rotary tables.** ``mx.fast.rope`` on the CPU builds its sines and cosines on every
  call, 60 times a step at the same positions, and applies them in some twenty
  operations. The table is built once per positions (once per step for the whole decode
  batch, :func:`shared_positions`), broadcast once to the rows' shape, and applied as
  ``x * cos + swapped(x) * sin`` (one fused kernel, :func:`_rotate`), the signs folded
  into the table (the same arithmetic: ``a + (-b)`` is ``a - b``).
* **Attention for one new token.** The CPU's attention broadcasts each key head over the
  query heads that share it and runs a small GEMM per query head; here the query heads
  that share a key head (up to 3: with 4 rows or more OpenBLAS's small GEMM sums in
  another order) are the rows of one GEMM, and its scale, lowest value and the step's
  mask come already at the scores' shape.
* **Norms for one new token**, as ``mx.fast.rms_norm`` computes them on the CPU, with the
  weight and constants already at the rows' shape, the arithmetic after the sum of
  squares one fused kernel (:func:`_rms`): 3 operations where it takes 11.
* **One token per row as rows.** Llama and qwen2 attention and MLP blocks take a decode
  step's ``[B, 1, D]`` as ``[B, D]``: no flatten and unflatten around each product, and
  the heads laid out by a reshape alone.
* **Prompt attention's softmax.** MLX's CPU exponential is a polynomial evaluated one
  element at a time through libm's software ``fmaf``; a follow-up's attention over a long
  cached prefix takes millions of them a layer, most of its prefill. A prompt chunk with
  enough scores (:data:`PROMPT_SOFTMAX_MIN_SCORES`) computes them with MLX's GEMMs as
  before and takes the softmax's exponentials from numpy (:func:`_prompt_attention`).
* **Fused kernels** are MLX's ``mx.compile`` (shapeless), which on the CPU builds C++ at
  run time, as mlx-lm's own ``swiglu`` already does in every llama MLP; each fused
  function is tested to give the bits of its operations run one by one, and is built at
  load (:func:`_warm_up`) rather than in the first reply.
* **Transposes kept.** ``nn.Linear`` multiplies by ``weight.T``, a new transpose node
  every call (210 a step); here each layer keeps that transpose, a view of the same
  memory.

Not applied on Metal (the GPU has its own fused kernels), to quantized layers, or in a
group of Macs (not tried there). ``RADIXCHAT_CPU_SPEEDUPS=0`` turns them off. The
figures (operation counts, ``radixchat bench serve --against mlx-lm``) are in
docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections.abc import Iterator
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from core import mlx_lm_compat


def wanted() -> bool:
    """Whether to apply them: on the CPU backend, unless ``RADIXCHAT_CPU_SPEEDUPS=0``."""
    return _on() and mx.default_device() == mx.cpu


def _on() -> bool:
    return os.environ.get("RADIXCHAT_CPU_SPEEDUPS", "1") != "0"


def apply(model: nn.Module) -> list[str]:
    """Apply the speed-ups to ``model`` (engine thread). Returns what was done, in words."""
    tables = _RopeTables()
    swaps = (  # (mlx's class, ours, what it holds, in words)
        (
            nn.Linear,
            _TransposedLinear,
            lambda m: _Transposed(m.weight),
            "linear layers keep their weights' transposes",
        ),
        (
            nn.RMSNorm,
            _DecodeRMSNorm,
            lambda m: _Widened(m.weight),
            "norms skip their broadcasts when decoding",
        ),
        (nn.RoPE, _TabledRoPE, lambda m: tables, "rotary embeddings share their tables"),
    )
    done = []
    for mlx_class, ours, held, words in swaps:
        count = 0
        for _, module in model.named_modules():
            if type(module) is mlx_class and (mlx_class is not nn.RoPE or module.dims % 2 == 0):
                module.__class__ = ours
                module._held = held(module)
                count += 1
        if count:
            done.append(f"{count} {words}")
    count = 0
    for _, module in model.named_modules():
        flat = _flat_class(type(module))
        if flat is not None:
            module.__class__ = flat
            count += 1
    if count:
        done.append(f"{count} attention and MLP blocks decode on rows, not on 1-token sequences")
    if any(type(m) is _TabledRoPE for _, m in model.named_modules()):
        model._radixchat_rope_tables = tables
    folded = _fold_attention(model)
    if folded:
        done.append(f"grouped-query attention folded in {', '.join(folded)}")
    _warm_up(model, tables)
    return done


def _warm_up(model: nn.Module, tables: _RopeTables) -> None:
    """Have MLX build the fused kernels of :func:`_rms` and :func:`_rotate` now, at load,
    rather than in the first reply: MLX compiles them to C++ at run time (as it does
    mlx-lm's own ``swiglu``), slowly the first time on a machine (it keeps them in its
    cache folder), one per layout, so each is run once here on the layouts a
    forward gives it: one row and a batch, a prompt and one token."""
    norm = next((m for _, m in model.named_modules() if type(m) is _DecodeRMSNorm), None)
    rope = next((m for _, m in model.named_modules() if type(m) is _TabledRoPE), None)
    out = []
    for rows in (1, 2):
        if norm is not None and norm.weight.dtype == mx.float32 and norm.weight.ndim == 1:
            out.append(norm(mx.zeros((rows, 1, norm.weight.shape[0]), mx.float32)))
        if rope is not None:
            for length, offset in itertools.product((1, 2), (3, mx.full((rows,), 3, mx.int32))):
                out.append(rope(mx.zeros((rows, 2, length, rope.dims), mx.float32), offset=offset))
    mx.eval(out)
    tables.clear()


@contextlib.contextmanager
def shared_positions(model: nn.Module, offset) -> Iterator[None]:
    """While a batch's forward runs: every layer's cache has ``offset`` as its positions
    (a decode batch of full-attention caches), so one rotary table serves every layer."""
    tables = getattr(model, "_radixchat_rope_tables", None)
    if tables is None or not isinstance(offset, mx.array):
        yield
        return
    tables.step_offset = offset
    try:
        yield
    finally:
        tables.step_offset = None
        tables.clear()


# ---------------------------------------------------------------------- linear layers
class _Transposed:
    """A weight and its transpose, evaluated once: a view of the same memory."""

    def __init__(self, weight: mx.array):
        self.weight, self.t = weight, weight.T
        mx.eval(self.t)


class _TransposedLinear(nn.Linear):
    """``nn.Linear`` multiplying by its weight's transpose kept from the last call rather
    than by a new transpose node each call (the same view, so the same product)."""

    def __call__(self, x: mx.array) -> mx.array:
        weight = self["weight"]
        if self._held.weight is not weight:  # replaced since: hold the new one
            self._held = _Transposed(weight)
        if "bias" in self:
            return mx.addmm(self["bias"], x, self._held.t)
        return x @ self._held.t


# ---------------------------------------------------------------------- one token per row
class _FlatAttention:
    """A llama-style attention block taking one new token per row as rows: ``[B, D]``
    through its projections (no flatten and unflatten around each product), the heads
    laid out by a reshape alone (with one position the transpose to ``[B, heads, 1, dims]``
    moves nothing), the output back in one reshape. The same products on the same
    numbers: the same bits. Prompts take mlx-lm's own path. It reads mlx-lm's fields
    ``mlx_lm_compat.ATTENTION_FIELDS`` and calls the attention function its module holds
    (mlx-lm's, or the fold)."""

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        rows, length, width = x.shape
        if length != 1 or cache is None:
            return super().__call__(x, mask, cache)
        flat = x.reshape(rows, width)
        queries = self.rope(
            self.q_proj(flat).reshape(rows, self.n_heads, 1, -1), offset=cache.offset
        )
        keys = self.rope(
            self.k_proj(flat).reshape(rows, self.n_kv_heads, 1, -1), offset=cache.offset
        )
        keys, values = cache.update_and_fetch(
            keys, self.v_proj(flat).reshape(rows, self.n_kv_heads, 1, -1)
        )
        attend = mlx_lm_compat.attention_function(type(self))  # folded, or mlx-lm's
        output = attend(queries, keys, values, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(output.reshape(rows, -1)).reshape(rows, 1, -1)


class _FlatMLP:
    """A llama-style MLP taking one new token per row as rows (``[B, D]``): three products
    with no flatten and unflatten around each."""

    def __call__(self, x: mx.array) -> mx.array:
        if x.ndim != 3 or x.shape[1] != 1:
            return super().__call__(x)
        return super().__call__(x.reshape(x.shape[0], x.shape[2])).reshape(x.shape[0], 1, -1)


_FLAT: dict[type, type | None] = {}  # a class -> ours, or None where none applies (once per class)


def _flat_class(cls: type) -> type | None:
    """Ours for mlx-lm's llama and qwen2 attention and MLP classes (whose forward the
    mixins above rewrite), None for any other class."""
    if cls not in _FLAT:
        kind = mlx_lm_compat.llama_style_blocks().get(cls)
        mixin = {"attention": _FlatAttention, "mlp": _FlatMLP}.get(kind)
        # in mlx-lm's module, where the attention looks up (and the fold wraps) its function
        _FLAT[cls] = (
            None
            if mixin is None
            else type(
                f"{mixin.__name__}{cls.__name__}", (mixin, cls), {"__module__": cls.__module__}
            )
        )
    return _FLAT[cls]


# ---------------------------------------------------------------------- norms
class _Widened:
    """A norm's weight, and per decode shape that weight and the constants of the norm
    laid out at that shape."""

    def __init__(self, weight: mx.array):
        self.weight = weight
        self.shapes: dict[tuple[int, ...], tuple[mx.array, mx.array, mx.array]] = {}


class _DecodeRMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` for one new token per row, as ``mx.fast.rms_norm`` computes it on the
    CPU (``x * rsqrt(mean(x^2) + eps) * weight``, the mean a sum times ``1/n``), with its
    weight and constants already at the rows' shape and the arithmetic after the sum one
    fused kernel: three operations where it takes eleven, three of them broadcasts.
    Other shapes (prompts) take ``mx.fast.rms_norm``."""

    def __call__(self, x: mx.array) -> mx.array:
        weight = self["weight"]
        if (
            x.ndim != 3
            or x.shape[1] != 1
            or x.shape[0] > 64
            or x.dtype != mx.float32
            or weight.dtype != mx.float32
        ):
            return super().__call__(x)
        if self._held.weight is not weight:  # replaced since
            self._held = _Widened(weight)
        wide = self._held.shapes.get(x.shape)
        if wide is None:
            rows = (x.shape[0], 1, 1)
            wide = self._held.shapes[x.shape] = (
                mx.broadcast_to(weight, x.shape),
                mx.full(rows, 1.0 / x.shape[-1], mx.float32),
                mx.full(rows, self.eps, mx.float32),
            )
            mx.eval(wide)
        widened, inverse_n, eps = wide
        return _rms(x, widened, inverse_n, eps)


@partial(mx.compile, shapeless=True)
def _rms(x, widened, inverse_n, eps):
    return (x * mx.rsqrt(mx.sum(mx.square(x), axis=-1, keepdims=True) * inverse_n + eps)) * widened


@partial(mx.compile, shapeless=True)
def _rotate(x, swapped, cos, sin):
    return x * cos + swapped * sin


# ---------------------------------------------------------------------- rotary tables
class _RopeTables:
    """Cosines and sines by (rope parameters, positions, length): computed as
    ``mx.fast.rope`` computes them on the CPU, so applying them gives its very bits."""

    MAX_ENTRIES = 8  # a forward needs one or two (two rope bases); a hybrid batch one per layer

    def __init__(self):
        self.step_offset: mx.array | None = None
        self._tables: dict[tuple, tuple] = {}

    def clear(self) -> None:
        self._tables.clear()

    def get(
        self, rope: nn.RoPE, shape: tuple[int, ...], offset
    ) -> tuple[mx.array, mx.array] | None:
        """The table for rotating an array of ``shape`` (..., length, dims) at ``offset``,
        broadcast to that shape (once per shape: each layer's rotation then multiplies
        arrays of one shape, with no broadcast of its own)."""
        length = shape[-2]
        params = (rope.dims, float(rope.base), float(rope.scale), bool(rope.traditional), length)
        if isinstance(offset, int):
            key, positions = params + ("at", offset), offset
        elif isinstance(offset, mx.array) and offset.ndim == 1:
            step = self.step_offset is not None and offset.shape == self.step_offset.shape
            positions = self.step_offset if step else offset
            key = params + (("step",) if step else ("array", id(offset)))
        else:
            return None
        entry = self._tables.get(key)
        if entry is None:
            if len(self._tables) >= self.MAX_ENTRIES:
                self._tables.clear()
            entry = self._tables[key] = (
                *_table(positions, length, *params[:3], params[3]),
                positions,
                {},
            )
        cos, sin, _, wide = entry
        if cos.shape == shape:
            return cos, sin
        if shape not in wide:
            wide[shape] = (mx.broadcast_to(cos, shape), mx.broadcast_to(sin, shape))
        return wide[shape]


def _table(
    offset, length: int, dims: int, base: float, scale: float, traditional: bool
) -> tuple[mx.array, mx.array]:
    """The cosines and sines ``mx.fast.rope`` computes for these positions, laid out over
    the rotated features: ``x * cos + swapped(x) * sin`` is then its rotation, bit for bit
    (``a + (-b)`` is ``a - b`` exactly, and addition commutes)."""
    half = dims // 2
    inv_freqs = mx.exp(mx.arange(0, -half, -1, dtype=mx.float32) * (math.log(base) / half))
    steps = mx.arange(length, dtype=mx.float32)
    if isinstance(offset, int):
        theta = ((steps + offset) * scale)[:, None] * inv_freqs[None, :]  # (length, half)
    else:
        positions = (steps[None, :] + offset.astype(mx.float32)[:, None]) * scale
        # (rows, 1, length, half)
        theta = (positions[:, :, None] * inv_freqs[None, None, :])[:, None]
    cos, sin = mx.cos(theta), mx.sin(theta)
    if traditional:  # neighbours (x0, x1) turn into (x0 cos - x1 sin, x1 cos + x0 sin)
        cos = mx.repeat(cos, 2, axis=-1)
        sin = mx.stack([-sin, sin], axis=-1).reshape(*sin.shape[:-1], dims)
    else:  # the first half with the second
        cos = mx.concatenate([cos, cos], axis=-1)
        sin = mx.concatenate([-sin, sin], axis=-1)
    return cos, sin


class _TabledRoPE(nn.RoPE):
    """``nn.RoPE`` applying a shared table: the bits of ``mx.fast.rope`` on the CPU, in
    a few operations instead of its twenty-odd."""

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        rotated = x[..., : self.dims] if self.dims < x.shape[-1] else x
        table = self._held.get(self, rotated.shape, offset) if x.ndim == 4 else None
        if table is None:
            return super().__call__(x, offset)
        cos, sin = table
        if self.traditional:
            swapped = rotated.reshape(*rotated.shape[:-1], self.dims // 2, 2)[..., ::-1].reshape(
                rotated.shape
            )
        else:
            half = self.dims // 2
            swapped = mx.concatenate([rotated[..., half:], rotated[..., :half]], axis=-1)
        out = _rotate(rotated, swapped, cos, sin)
        if self.dims < x.shape[-1]:
            out = mx.concatenate([out, x[..., self.dims :]], axis=-1)
        return out


# ---------------------------------------------------------------------- folded attention
def _fold_attention(model: nn.Module) -> list[str]:
    """Wrap ``scaled_dot_product_attention`` where the model's attention modules look it
    up (their mlx-lm module: ``mlx_lm_compat.attention_function``). The wrapper is the same
    function wherever it does not fold, so another model of that kind in this process
    computes what it did."""
    folded = []
    for _, module in model.named_modules():
        original = mlx_lm_compat.attention_function(type(module))
        name = type(module).__module__.rsplit(".", 1)[-1]
        if original is None or name in folded:
            continue
        if not getattr(original, "_radixchat_folded", False):  # else wrapped for an earlier model
            mlx_lm_compat.replace_attention_function(type(module), _folding(original))
        folded.append(name)
    return folded


# query heads per key head: up to 3 rows, OpenBLAS's AVX-512 small GEMM gave the same bits
MAX_FOLDED = 3


def _folding(original):
    def scaled_dot_product_attention(
        queries, keys, values, cache, scale, mask, sinks=None, **kwargs
    ):
        rows, heads, length, dims = queries.shape
        kv_heads = keys[0].shape[1] if isinstance(keys, (tuple, list)) else keys.shape[1]
        if length > 1 and _prompt_softmax_applies(queries, keys, cache, mask, sinks, kwargs):
            return _prompt_attention(queries, keys, values, scale, mask)
        if (
            length != 1
            or not _on()
            or heads == kv_heads
            or sinks is not None
            or kwargs
            or hasattr(cache, "bits")
            or keys.ndim != 4
            or heads % kv_heads
            or heads // kv_heads > MAX_FOLDED
            or queries.dtype != mx.float32
            or (
                mask is not None
                and (
                    not isinstance(mask, mx.array)
                    or mask.ndim != 4
                    or mask.shape[1] != 1
                    or mask.shape[2] != 1
                )
            )
        ):
            if sinks is not None:
                kwargs["sinks"] = sinks
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, **kwargs)
        # what mx.fast.scaled_dot_product_attention computes on the CPU, with its constants and
        # the step's mask already at the scores' shape (one broadcast a step, not three a layer)
        folded = queries.reshape(rows, kv_heads, heads // kv_heads, dims)
        scores = (
            _wide(mx.array(scale, mx.float32), folded.shape, ("scale", scale)) * folded
        ) @ keys.swapaxes(-1, -2)
        if mask is not None:
            wide_mask = _wide(mask, scores.shape, id(mask))  # the same mask for every layer
            if mask.dtype == mx.bool_:
                lowest = mx.array(mx.finfo(mx.float32).min, mx.float32)
                scores = mx.where(wide_mask, scores, _wide(lowest, scores.shape, "lowest"))
            else:
                scores = scores + wide_mask
        out = mx.softmax(scores, axis=-1, precise=True) @ values
        return out.reshape(rows, heads, 1, dims)

    scaled_dot_product_attention._radixchat_folded = True
    scaled_dot_product_attention.__wrapped__ = original
    return scaled_dot_product_attention


_WIDE: dict[tuple, tuple[mx.array, mx.array]] = {}  # (what, its broadcast) by (key, shape)


def _wide(value: mx.array, shape: tuple[int, ...], key) -> mx.array:
    """``value`` broadcast to ``shape``, made once for every layer that uses it (``key``
    names the value; the entry holds it, so an ``id`` in the key stays its own)."""
    entry = _WIDE.get((key, shape))
    if entry is None:
        if len(_WIDE) >= 32:
            _WIDE.clear()
        entry = _WIDE[(key, shape)] = (value, mx.broadcast_to(value, shape))
    return entry[1]


# ---------------------------------------------------------------------- prompt attention
# Scores (query heads x new tokens x keys) in one attention call from which the softmax
# goes through numpy: below this, the hand-over's fixed cost (MLX waits for the scores)
# outweighs what the faster exponential saves. A speculative verify step (2 to 17 tokens)
# over a long prefix is above it: over a 4k prefix (SmolLM2 float32, 2 busy cores) a
# 17-token verify took 365 ms against 642 ms with the threshold at 2^20, 9 tokens 372
# against 462 ms, a plain step ~125-150 ms (docs/benchmarks.md).
PROMPT_SOFTMAX_MIN_SCORES = 1 << 16


def _prompt_softmax_applies(queries, keys, cache, mask, sinks, kwargs) -> bool:
    """Whether a prompt chunk's attention takes :func:`_prompt_attention`: float32 on the
    CPU, no sinks or quantized cache, a mask it can lay over the grouped scores, and
    scores enough to pay for the hand-over."""
    rows, heads, length, _ = queries.shape
    return (
        _on()
        and mx.default_device() == mx.cpu
        and sinks is None
        and not kwargs
        and not hasattr(cache, "bits")
        and keys.ndim == 4
        and heads % keys.shape[1] == 0
        and queries.dtype == mx.float32
        and keys.dtype == mx.float32
        and rows * heads * length * keys.shape[2] >= PROMPT_SOFTMAX_MIN_SCORES
        and (
            mask is None
            or (isinstance(mask, str) and mask == "causal")
            or (
                isinstance(mask, mx.array)
                and mask.ndim == 4
                and mask.shape[1] in (1, heads)
                and mask.shape[2] == length
            )
        )
    )


def _prompt_attention(queries, keys, values, scale, mask) -> mx.array:
    """What ``mx.fast.scaled_dot_product_attention`` computes on the CPU for a prompt chunk
    (scaled queries times keys, the mask, a softmax over the keys, times values), with the
    softmax's exponentials taken by numpy.

    On the CPU MLX's exponential is a polynomial evaluated one element at a time through
    libm's software ``fmaf`` (about 12 ns an element on an idle core here); numpy's is
    vectorised (under half a nanosecond). Over a long cached prefix the scores are
    millions a layer, and their exponentials were most of a follow-up's prefill
    (``radixchat bench followup``: docs/benchmarks.md). The products stay MLX's (the same
    GEMMs); the softmax is the same formula (``exp(s - max) / sum``) with another
    exponential (numpy's is the more accurate of the two), another order of summation, and
    the division by the sum taken after the product with the values: equal within float32
    rounding (``tests/core/engine/test_cpu_speedups.py``)."""
    rows, heads, length, dims = queries.shape
    kv_heads, keys_n = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    grouped = (mx.array(scale, mx.float32) * queries).reshape(rows, kv_heads, group, length, dims)
    scores = grouped @ keys[:, :, None].swapaxes(-1, -2)  # (rows, kv, group, length, keys)
    if isinstance(mask, str):  # causal: new token i sees the keys up to its own position
        seen = mx.arange(keys_n - length, keys_n)[:, None] >= mx.arange(keys_n)[None]
        mask = seen
    if mask is not None:
        if mask.ndim == 4:  # (rows or 1, heads or 1, length, keys): over the grouped heads
            if mask.shape[1] == 1:
                mask = mask[:, :, None]
            else:
                mask = mask.reshape(mask.shape[0], kv_heads, group, length, keys_n)
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.array(mx.finfo(mx.float32).min, mx.float32))
        else:
            scores = scores + mask.astype(mx.float32)
    mx.eval(scores)
    # MLX's buffer, no copy: this call's own temporary (nothing else holds it), overwritten
    # with exp(s - max) in place
    held = np.asarray(scores)
    np.subtract(held, held.max(axis=-1, keepdims=True), out=held)
    np.exp(held, out=held)
    total = mx.array(held.sum(axis=-1, keepdims=True))
    # normalised after the product with the values: a division per output, not per score
    out = (scores @ values[:, :, None]) / total
    return out.reshape(rows, heads, length, dims)
