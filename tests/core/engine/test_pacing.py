"""Prefill chunk sizes from the measured rate: as large as the budget allows while others
decode, never under the minimum, whole chunks when nobody decodes."""

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
