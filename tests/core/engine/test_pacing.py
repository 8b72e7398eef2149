"""Prefill chunk sizes from the measured rate: as large as the budget allows while others
decode, never under the minimum, whole chunks when nobody decodes (or what fits an idle budget)."""

from __future__ import annotations

from core.engine import generation
from core.engine.pacing import CHUNK_STEP, MARGIN, MIN_CHUNK, ChunkPacer


def test_nobody_decoding_takes_the_largest_chunk():
    assert ChunkPacer().size(decoding=False) == generation.PREFILL_CHUNK
    assert ChunkPacer(largest=96).size(decoding=False) == 96


def test_unmeasured_the_first_chunk_is_small():
    assert ChunkPacer().size(decoding=True) == MIN_CHUNK


def test_the_chunk_fits_the_budget_from_the_last_rate():
    pacer = ChunkPacer(budget_s=0.5, largest=4096)
    pacer.observe(64, 0.1)  # 640 tokens/s: 0.5 s * MARGIN holds 256 tokens
    assert pacer.size(decoding=True) == int(0.5 * MARGIN * 640) // CHUNK_STEP * CHUNK_STEP == 256
    pacer.observe(256, 1.0)  # deeper in the prompt, slower: the next chunk shrinks
    assert pacer.size(decoding=True) == 96
    pacer.observe(100, 1.0)  # 100 tokens/s: 40 fit, not rounded down to 32
    assert pacer.size(decoding=True) == 40
    pacer.observe(32, 2.0)  # too slow for the budget: never under the minimum
    assert pacer.size(decoding=True) == MIN_CHUNK
    pacer.observe(2000, 0.01)  # very fast: capped at the largest chunk
    assert pacer.size(decoding=True) == 4096


def test_short_calls_do_not_count():
    pacer = ChunkPacer()
    pacer.observe(5, 1.0)  # a prompt's last few tokens: mostly fixed cost
    assert pacer.seconds_per_token is None


def test_with_an_idle_budget_nobody_decoding_takes_what_fits_it():
    """Issue 42.2: a prompt that arrives while a long one is prefilled waits for the chunk in
    flight, so chunks fit a budget even while nobody decodes (a 256-token chunk deep in a
    long prompt took seconds on a CPU)."""
    pacer = ChunkPacer(largest=4096, idle_budget_s=0.5)
    assert pacer.size(decoding=False) == 4096  # nothing measured: the largest, as before
    pacer.observe(100, 1.0)  # 100 tokens/s
    assert pacer.size(decoding=False) == 40 == int(0.5 * MARGIN * 100) // CHUNK_STEP * CHUNK_STEP
    pacer.observe(32, 2.0)
    assert pacer.size(decoding=False) == MIN_CHUNK
    assert ChunkPacer(largest=96, idle_budget_s=None).size(decoding=False) == 96


def test_an_idle_batched_prefill_fits_the_idle_budget():
    pacer = ChunkPacer(idle_budget_s=0.5)
    assert pacer.batch_tokens(decoding=False, idle=2048) == 2048  # nothing measured
    pacer.observe(400, 1.0)  # 400 tokens/s: 160 padded tokens fit
    assert pacer.batch_tokens(decoding=False, idle=2048) == 160
    pacer.observe(4000, 1.0)
    assert pacer.batch_tokens(decoding=False, idle=2048) == 1600
    pacer.observe(40000, 1.0)
    assert pacer.batch_tokens(decoding=False, idle=2048) == 2048  # never more than idle
    assert ChunkPacer().batch_tokens(decoding=False, idle=2048) == 2048  # no idle budget
