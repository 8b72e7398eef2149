"""The CPU backend's speed-ups compute what mlx-lm's own forward computes: fused
projections, shared rotary tables and folded grouped-query attention, on every kind of
tiny model and on the real default model (whose matrices take OpenBLAS's other kernels),
prefilling and decoding, alone and in a left-padded batch.

Each of them is another computation of the same numbers (a GEMM over more rows, a table
instead of ``mx.fast.rope``, a compiled kernel instead of operations one by one): with
the OpenBLAS kernels of the machine they were written on the bits agreed, with another
family's (``OPENBLAS_CORETYPE=Prescott``) the folded attention's last bit moved (issue
27). So the tests compare within float32 rounding (``assert_close``: 1e-5 relative for
one operation, DESIGN's 1e-4 for a model's logits) and compare greedy tokens one by one,
never the bits. Where both sides are the same computation the comparison stays exact and
says so."""

from __future__ import annotations

import itertools

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache

from core.engine import cpu_speedups
from core.engine.config import EngineConfig
from core.engine.cpu_speedups import _RopeTables, _TabledRoPE, shared_positions
from core.models.load.loader import load_model
from core.models.tiny_model import TinyModelSpec, write_tiny_model

KINDS = ("llama", "qwen2", "sliding", "recurrent", "llama-sliding")


def assert_close(got: mx.array, want: mx.array, rtol: float = 1e-5, what: str = "") -> None:
    """Different computations of the same numbers: equal within float32 rounding."""
    assert got.shape == want.shape and got.dtype == want.dtype, what
    scale = max(float(mx.abs(want).max()), 1e-6)
    drift = float(mx.abs(got - want).max())
    assert drift <= rtol * scale, (
        f"{what}: off by {drift:.3g} of {scale:.3g} (more than {rtol:g} relative)"
    )


def _spec(kind: str) -> TinyModelSpec:
    return TinyModelSpec(
        kind=kind,
        num_layers=2 if kind in ("llama", "qwen2") else 4,
        num_heads=6,
        num_kv_heads=2,
        hidden_size=96,
        sliding_window=8,
    )


@pytest.fixture(scope="module", params=KINDS)
def two_copies(request, tmp_path_factory):
    """The same tiny model loaded twice: as mlx-lm builds it, and sped up."""
    path = write_tiny_model(tmp_path_factory.mktemp(request.param) / "m", _spec(request.param))
    data = tmp_path_factory.mktemp("data")
    plain, fast = load_model(str(path), data), load_model(str(path), data)
    done = cpu_speedups.apply(fast.model)
    assert any("rotary" in d for d in done)
    return plain.model, fast.model


def _run(model, prompts: list[list[int]], steps: int) -> tuple[list[mx.array], list[list[int]]]:
    """Logits of a prefill of each prompt alone, then of ``steps`` greedy decode steps of
    all of them in one left-padded batch (as the decode batch runs them); and the greedy
    tokens the model chose along the way, its own choices fed back."""
    out, chosen = [], []
    for prompt in prompts:
        cache = make_prompt_cache(model)
        logits = model(mx.array([prompt]), cache=cache)
        out.append(logits)
        for _ in range(2):  # decoding alone: an int offset
            token = mx.argmax(logits[:, -1:], axis=-1)
            chosen.append(token.reshape(-1).tolist())
            logits = model(token, cache=cache)
            out.append(logits)
    width = max(map(len, prompts))
    padding = [width - len(p) for p in prompts]
    if not all(type(c) is KVCache for c in make_prompt_cache(model)):
        # a batch of full-attention caches, where the decode batch shares the tables
        return out, chosen
    cache = [BatchKVCache(padding) for _ in model.layers]
    logits = model(mx.array([[0] * pad + p for pad, p in zip(padding, prompts)]), cache=cache)
    out.append(logits)
    tokens = mx.argmax(logits[:, -1:], axis=-1)
    for _ in range(steps):
        chosen.append(tokens.reshape(-1).tolist())
        with shared_positions(model, cache[0].offset):
            logits = model(tokens, cache=cache)
        out.append(logits)
        tokens = mx.argmax(logits[:, -1:], axis=-1)
    chosen.append(tokens.reshape(-1).tolist())
    return out, chosen


def assert_same_forward(plain, fast, prompts: list[list[int]], steps: int) -> None:
    """Different computations (the sped-up forward against mlx-lm's own): every logit
    within DESIGN's float32 rounding (1e-4 relative), and the same greedy tokens, each
    side feeding back its own choices."""
    (want, want_tokens), (got, got_tokens) = _run(plain, prompts, steps), _run(fast, prompts, steps)
    assert len(want) == len(got)
    for i, (a, b) in enumerate(zip(want, got)):
        assert_close(b, a, rtol=1e-4, what=f"forward {i}")
    assert got_tokens == want_tokens, "the sped-up forward chose other greedy tokens"


@pytest.fixture
def every_prompt_softmax(monkeypatch):
    """Every prompt chunk's softmax through numpy, however small (the models here are)."""
    monkeypatch.setattr(cpu_speedups, "PROMPT_SOFTMAX_MIN_SCORES", 1)


def test_a_sped_up_tiny_model_computes_the_same_logits_and_tokens(two_copies, every_prompt_softmax):
    plain, fast = two_copies
    assert_same_forward(
        plain, fast, [[5, 17, 99, 3, 42, 8, 1, 77, 23], [9, 9, 100, 12], list(range(30, 52))], 4
    )


def test_the_real_default_model_computes_the_same_logits_and_tokens(
    default_model_file, tmp_path, every_prompt_softmax
):
    plain = load_model(str(default_model_file), tmp_path).model
    fast = load_model(str(default_model_file), tmp_path).model
    done = cpu_speedups.apply(fast)
    assert done == [
        "210 linear layers keep their weights' transposes",
        "61 norms skip their broadcasts when decoding",
        "30 rotary embeddings share their tables",
        "60 attention and MLP blocks decode on rows, not on 1-token sequences",
        "grouped-query attention folded in llama",
    ]
    assert_same_forward(
        plain, fast, [list(range(1000, 1040)), list(range(2000, 2013)), list(range(300, 364))], 3
    )


def test_a_follow_up_on_a_long_cached_prefix_computes_the_same_logits_and_tokens(
    default_model_file, tmp_path
):
    """A follow-up of 150 tokens on a 700-token prefix prefilled in the engine's chunks: its
    attention is large enough for the numpy softmax at the default threshold. Different
    computations: the last logits within float32 rounding, then the same greedy tokens."""
    plain = load_model(str(default_model_file), tmp_path).model
    fast = load_model(str(default_model_file), tmp_path).model
    cpu_speedups.apply(fast)
    prefix = [(i * 7919) % 40000 + 100 for i in range(700)]
    new = [(i * 104729) % 40000 + 100 for i in range(150)]
    assert 9 * len(new) * (len(prefix) + len(new)) >= cpu_speedups.PROMPT_SOFTMAX_MIN_SCORES
    runs = []
    for model in (plain, fast):
        cache = make_prompt_cache(model)
        for start in range(0, len(prefix), 256):
            model(mx.array([prefix[start : start + 256]]), cache=cache)
        logits = model(mx.array([new]), cache=cache)
        tokens = []
        for _ in range(4):
            tokens.append(mx.argmax(logits[:, -1], axis=-1).item())
            logits = model(mx.array([tokens[-1:]]), cache=cache)
        runs.append((logits, tokens))
    (want, want_tokens), (got, got_tokens) = runs
    assert_close(got, want, rtol=1e-4, what="after the follow-up")
    assert got_tokens == want_tokens


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (9, 3), (8, 8)])
def test_prompt_attention_gives_mx_fast_sdpas_values(heads, kv_heads):
    """The prompt chunk's attention with numpy's exponentials against
    ``mx.fast.scaled_dot_product_attention`` (different computations: another exponential,
    another order of summation): within float32 rounding, for every mask a prompt gets
    (causal over a cached prefix, a left-padded batch's boolean mask, an additive one)."""
    for rows, length, keys_n in ((1, 7, 7), (1, 20, 300), (3, 16, 40)):
        queries = mx.random.normal((rows, heads, length, 64))
        keys, values = (
            mx.random.normal((rows, kv_heads, keys_n, 64)),
            mx.random.normal((rows, kv_heads, keys_n, 64)),
        )
        offset = keys_n - length
        padding = [2 * row for row in range(rows)]
        allowed = mx.array(
            [
                [[offset + q >= k >= padding[row] for k in range(keys_n)] for q in range(length)]
                for row in range(rows)
            ]
        )[:, None]
        per_head = mx.broadcast_to(allowed, (rows, heads, length, keys_n))
        additive = mx.where(allowed, 0.0, -1e9).astype(mx.float32)
        for mask in ("causal", None, allowed, per_head, additive):
            assert cpu_speedups._prompt_softmax_applies(queries, keys, None, mask, None, {}) == (
                rows * heads * length * keys_n >= cpu_speedups.PROMPT_SOFTMAX_MIN_SCORES
            )
            assert_close(
                cpu_speedups._prompt_attention(queries, keys, values, 0.125, mask),
                mx.fast.scaled_dot_product_attention(queries, keys, values, scale=0.125, mask=mask),
                what=f"{rows} rows of {length} over {keys_n} keys, mask {type(mask).__name__}",
            )


def test_prompt_attention_is_taken_for_enough_scores_only(monkeypatch):
    taken = []
    monkeypatch.setattr(
        cpu_speedups,
        "_prompt_attention",
        lambda *args: taken.append(args[0].shape) or mx.zeros(args[0].shape),
    )
    folded = cpu_speedups._folding(
        lambda q, k, v, cache, scale, mask, sinks=None: mx.zeros(q.shape)
    )
    keys = mx.zeros((1, 3, 2200, 64))
    # decode, a verify step of one draft token, one of 3, a short follow-up, a long one
    for length in (1, 2, 4, 28, 200):
        folded(mx.zeros((1, 9, length, 64)), keys, keys, cache=None, scale=0.125, mask="causal")
    assert taken == [(1, 9, 4, 64), (1, 9, 28, 64), (1, 9, 200, 64)]
    taken.clear()
    half = mx.zeros((1, 9, 200, 64), mx.float16)
    folded(half, keys.astype(mx.float16), keys, cache=None, scale=0.125, mask="causal")
    monkeypatch.setenv("RADIXCHAT_CPU_SPEEDUPS", "0")
    folded(mx.zeros((1, 9, 200, 64)), keys, keys, cache=None, scale=0.125, mask="causal")
    assert taken == []  # neither half precision nor turned off


@pytest.mark.parametrize("traditional", [False, True])
def test_rotary_tables_give_mx_fast_ropes_values(traditional):
    for rows, length, width, dims, base, scale, kind in itertools.product(
        (1, 3), (1, 7), (64, 48), (64, 32), (1e4, 1e6), (1.0, 0.25), ("int", "array")
    ):
        if dims > width:
            continue
        x = mx.random.normal((rows, 2, length, width))
        offset = 777 if kind == "int" else mx.array([3 + 50 * i for i in range(rows)])
        rope = nn.RoPE(dims, traditional=traditional, base=base, scale=scale)
        want = rope(x, offset=offset)
        rope.__class__, rope._held = _TabledRoPE, _RopeTables()
        # different computations: a table applied in a few operations against mx.fast.rope
        assert_close(
            rope(x, offset=offset), want, what=str((rows, length, width, dims, base, kind))
        )


def test_one_table_serves_every_layer_in_a_batch_step():
    tables = _RopeTables()
    ropes = []
    for _ in range(3):
        rope = nn.RoPE(16, base=1e4)
        rope.__class__, rope._held = _TabledRoPE, tables
        ropes.append(rope)
    x = mx.random.normal((2, 2, 1, 16))
    model = nn.Module()
    model._radixchat_rope_tables = tables
    step = mx.array([10, 4])
    with shared_positions(model, step):
        # each layer its own offset array
        outs = [rope(x, offset=mx.array([10, 4])) for rope in ropes]
        assert len(tables._tables) == 1
    assert not tables._tables  # dropped after the step
    for out in outs:  # different computations: the shared table against mx.fast.rope
        assert_close(
            out,
            mx.fast.rope(x, 16, traditional=False, base=1e4, scale=1.0, offset=mx.array([10, 4])),
        )


def test_a_replaced_weight_is_used():
    linear = nn.Linear(8, 4)
    model = nn.Module()
    model.proj = linear
    cpu_speedups.apply(model)
    x = mx.random.normal((2, 8))
    # the same computation (addmm of the same transposed weight): exact
    assert mx.array_equal(linear(x), mx.addmm(linear.bias, x, linear.weight.T)).item()
    new = mx.random.normal((4, 8))
    linear.weight = new
    assert mx.array_equal(linear(x), mx.addmm(linear.bias, x, new.T)).item()


def test_the_fused_norm_and_rotation_give_the_values_of_their_operations_one_by_one():
    """MLX compiles ``_rms`` and ``_rotate`` into one kernel each: on every layout a forward
    gives them (one row or several, a broadcast weight or table, one token or a prompt)
    they compute what their operations compute one at a time. Different computations (a
    kernel MLX builds as C++ at run time, whose compiler may fuse a multiply and an add,
    against the operations one by one): within float32 rounding."""

    def rms(x, widened, inverse_n, eps):
        return (
            x * mx.rsqrt(mx.sum(mx.square(x), axis=-1, keepdims=True) * inverse_n + eps)
        ) * widened

    for rows in (1, 3, 8):
        x, weight = mx.random.normal((rows, 1, 576)) * 4, mx.random.normal((576,))
        constants = (
            mx.broadcast_to(weight, x.shape),
            mx.full((rows, 1, 1), 1 / 576, mx.float32),
            mx.full((rows, 1, 1), 1e-5, mx.float32),
        )
        assert_close(
            cpu_speedups._rms(x, *constants), rms(x, *constants), what=f"norm, {rows} rows"
        )
        for length in (1, 5):
            x, swapped = (
                mx.random.normal((rows, 9, length, 64)),
                mx.random.normal((rows, 9, length, 64)),
            )
            cos, sin = mx.random.normal((rows, 1, length, 64)), mx.random.normal((length, 64))
            cos, sin = mx.broadcast_to(cos, x.shape), mx.broadcast_to(sin, x.shape)
            assert_close(
                cpu_speedups._rotate(x, swapped, cos, sin),
                x * cos + swapped * sin,
                what=f"rotation, {rows} rows of {length}",
            )


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (9, 3), (8, 4), (8, 8)])
def test_folded_attention_gives_the_same_values(heads, kv_heads):
    calls = []

    def original(queries, keys, values, cache, scale, mask, sinks=None):
        calls.append(queries.shape)
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)

    folded = cpu_speedups._folding(original)
    for rows, length in ((1, 9), (3, 150)):
        keys, values = (
            mx.random.normal((rows, kv_heads, length, 64)),
            mx.random.normal((rows, kv_heads, length, 64)),
        )
        one = mx.random.normal((rows, heads, 1, 64))
        allowed = mx.array([[i >= 2 * row for i in range(length)] for row in range(rows)])[
            :, None, None, :
        ]
        for mask in (None, allowed, mx.where(allowed, 0.0, -1e9).astype(mx.float32)):
            calls.clear()
            # different computations: one GEMM over the query heads that share a key head
            # against mx.fast.scaled_dot_product_attention's one per head (Prescott's kernels
            # sum them in another order: the last bit moved)
            assert_close(
                folded(one, keys, values, cache=None, scale=0.125, mask=mask),
                original(one, keys, values, cache=None, scale=0.125, mask=mask),
                what=f"{rows} rows of {length}, mask {type(mask).__name__}",
            )
            # folded: only the reference call above; more than 3 query heads per key head
            # (OpenBLAS's small GEMM sums 4 rows or more in another order) or none: passed through
            assert len(calls) == (1 if 1 < heads // kv_heads <= 3 else 2)
        several = mx.random.normal((rows, heads, 3, 64))
        calls.clear()
        # a prompt: passed through
        folded(several, keys, values, cache=None, scale=0.125, mask="causal")
        assert calls == [several.shape]
        calls.clear()
        half = one.astype(mx.float16)
        folded(
            half,
            keys.astype(mx.float16),
            values.astype(mx.float16),
            cache=None,
            scale=0.125,
            mask=None,
        )
        assert calls == [half.shape]  # only float32 is folded (its bits tested)


def test_only_on_the_cpu_and_not_when_turned_off(monkeypatch):
    monkeypatch.setenv("RADIXCHAT_CPU_SPEEDUPS", "0")
    assert not cpu_speedups.wanted()
    monkeypatch.delenv("RADIXCHAT_CPU_SPEEDUPS")
    assert cpu_speedups.wanted() == (mx.default_device() == mx.cpu)


def test_the_engine_sped_up_gives_the_replies_it_gives_without(tiny_model, tmp_path, monkeypatch):
    """Through the engine (which applies them at load on the CPU): the same greedy replies,
    alone and decoded together, with the speed-ups and without (different computations:
    compared token by token)."""
    from core.engine.engine import Engine
    from core.engine.types import (
        ChatMessage,
        DoneEvent,
        GenerationRequest,
        SamplingParams,
    )
    from tests.core.engine.token_log import TokenLog

    log = TokenLog(monkeypatch)

    def replies(folder) -> tuple[list[str], list[list[int]]]:
        engine = Engine(
            tmp_path / folder, str(tiny_model), config=EngineConfig(pool_tokens=4096)
        ).start()
        try:
            engine.wait_ready(timeout=60)
            rope = engine._loaded.model.layers[0].self_attn.rope
            assert (type(rope) is _TabledRoPE) == cpu_speedups.wanted()
            asks = [
                GenerationRequest(
                    messages=(ChatMessage("user", text),),
                    use_cache=False,
                    sampling=SamplingParams(temperature=0.0, max_tokens=16),
                )
                for text in ("one question", "a second, longer question than that", "three")
            ]
            handles, done = [], []
            for a in asks:  # one at a time
                handles.append(engine.submit(a))
                done.append(list(handles[-1].events())[-1])
            together = [engine.submit(a) for a in asks]  # decoded together
            done += [list(h.events())[-1] for h in together]
            handles += together
        finally:
            engine.shutdown()
        assert all(isinstance(d, DoneEvent) for d in done)
        return [d.text for d in done], [log.of(h) for h in handles]

    sped_up = replies("on")
    monkeypatch.setenv("RADIXCHAT_CPU_SPEEDUPS", "0")
    plain = replies("off")
    assert plain[1] == sped_up[1], "the sped-up engine chose other greedy tokens"
    assert plain[0] == sped_up[0]
