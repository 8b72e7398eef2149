"""Batched prefill: the prompts that wait together go in one padded forward.

``mlx_lm.server`` prefills the prompts that wait together as one batch (its
``PromptProcessingBatch``: per-request caches merged into batch caches, the prompts right
padded, ``prepare`` / ``finalize`` turning the right padding into the left padding the
batch caches keep), so its clients' first tokens come together and they decode as one
batch from there. One at a time, the waiting prompts each take a forward of their own and
each arrival changes the running batch. Here, when the first waiting prompt (by priority,
then arrival) and the ones after it are short enough to go together within the pacer's
budget, they are prefilled in one forward through mlx-lm's ``PromptProcessingBatch``
(its merge, padding and cache filter / extract), the vocabulary projection runs on each
row's last real position only (``core.engine.generation.rows_logits``), each row samples
its first token from those logits, and the rows join the decode batch together, their
merged caches as they are (``DecodeBatch.join_rows``): no per-row forward, no re-merge.

Exactness: right padding sits after a row's real tokens, so causal attention never lets a
real position see it; ``finalize`` rolls it to the left, where the batch cache masks it.
A row leaves the batch (``extract``) with exactly its own tokens' K/V, which the radix
tree then caches as before. Rows may start from different cached prefixes (the merge left
pads the shorter ones).

Where this path is not taken (the prompt goes one at a time, as before):
- a model with sliding-window or recurrent layers. Its tree resumes a prompt from a
  snapshot of those layers taken right before the prompt's last token, which one forward
  over whole prompts cannot give (and a rotating cache past its window with right padding
  is not the one-at-a-time computation), so such prompts keep the chunked path;
- a prompt already part-way through its chunks, or one whose rest does not fit the budget
  with the others (it goes in chunks, interleaved with decode, as before);
- the distributed group (``core.distributed.engine``): its ranks agree on each prompt's
  cached prefix one prompt at a time, on the one-at-a-time path.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from core.engine.generation import rows_logits
from core.mlx_lm_compat import PromptProcessingBatch, generation_stream

PREFILL_ROWS = 8  # prompts prefilled together at most (mlx-lm's prefill_batch_size)
# padded tokens in one batched prefill while nobody decodes (mlx-lm's prefill_step_size)
IDLE_TOKENS = 2048


def batchable(caches: list) -> bool:
    """Whether a prompt whose prefill starts from ``caches`` can go in a batched prefill:
    full-attention layers only (see the module's docstring for why not the others)."""
    return all(type(cache) is KVCache for cache in caches)


def rows_that_fit(rests: list[int], tokens: int, rows: int = PREFILL_ROWS) -> int:
    """How many of the prompts (their remaining lengths ``rests``, in turn order) go
    together: the longest first run whose padded size (rows x the longest) fits in
    ``tokens``, at most ``rows``."""
    n, longest = 0, 0
    for rest in rests[:rows]:
        if (n + 1) * max(longest, rest) > tokens:
            break
        n, longest = n + 1, max(longest, rest)
    return n


@dataclass
class PrefilledRows:
    """A batched prefill's result: the merged caches (``batch.prompt_cache``, a row per
    prompt, each holding its prompt; ``batch.tokens`` what each row holds) and each row's
    logits after its last prompt token (``(rows, vocab)``)."""

    batch: PromptProcessingBatch
    logits: mx.array
    padded_tokens: int  # rows x the longest rest: what the forward computed

    def caches(self, row: int) -> list:
        """Row ``row``'s own caches (a copy of its K/V, without padding)."""
        return self.batch.extract_cache(row)

    def keep(self, rows: list[int]) -> None:
        """Drop every row but ``rows`` (in that order)."""
        with mx.stream(generation_stream):
            self.batch.filter(rows)


def prefill_rows(
    model, caches: list[list], held: list[list[int]], rests: list[list[int]]
) -> PrefilledRows:
    """Prefill ``rests[i]`` (non-empty) on top of ``caches[i]`` (holding ``held[i]``) for
    every row in one padded forward; see the module's docstring."""
    lengths = [len(rest) for rest in rests]
    longest = max(lengths)
    padding = [longest - n for n in lengths]
    with mx.stream(generation_stream):
        # (samplers and processors stay the scheduler's: the batch carries the rows' caches)
        batch = PromptProcessingBatch(
            model,
            list(range(len(caches))),
            caches,
            tokens=[list(h) for h in held],
            samplers=[None] * len(caches),
            logits_processors=[()] * len(caches),
        )
        if max(padding) > 0:
            # right padded
            inputs = mx.array([rest + [0] * (longest - len(rest)) for rest in rests])
            for cache in batch.prompt_cache:
                cache.prepare(lengths=lengths, right_padding=padding)
        else:
            inputs = mx.array(rests)
        logits = rows_logits(model, inputs, batch.prompt_cache, [n - 1 for n in lengths])
        if max(padding) > 0:
            for cache in batch.prompt_cache:
                cache.finalize()
    mx.eval(logits, [cache.state for cache in batch.prompt_cache])
    for row, rest in zip(batch.tokens, rests):
        row += rest
    return PrefilledRows(batch, logits, len(rests) * longest)
