"""How big the next prefill chunk may be while other requests are decoding.

The scheduler alternates: every running stream takes a decode step, then the prompt being
prefilled takes one chunk. A stream's next token therefore waits for at most one chunk,
and the chunk is sized from the prefill rate measured on the chunks before it so that it
takes about ``DECODE_WAIT_S``. The rate is the last chunk's (tokens per second at nearly
the depth of the next one: attention makes a chunk deep in a long prompt slower per token
than the first), and the size keeps a margin below the budget for the next chunk being
deeper still.

Nobody decoding, a chunk is sized the same way to ``IDLE_WAIT_S``: a prompt that arrives
meanwhile (another client's: ``core.engine.turns`` gives it the next chunk) waits for the
chunk in flight, and a 256-token chunk deep in a long prompt took seconds on a CPU. Only
the first chunk the pacer ever sizes, with no rate measured yet, is a full
``PREFILL_CHUNK``. (``idle_budget_s`` None: full chunks whenever nobody decodes, as before
the round robin between clients.)

The bound: a decode step waits for one chunk of at most ``DECODE_WAIT_S`` (0.75 s), so a
stream's inter-token gap is at most its own decode step plus 0.75 s, as long as the rate
holds from one chunk to the next and ``MIN_CHUNK`` tokens fit in the budget (on a machine
where 32 tokens of prefill take longer than that, a chunk is never smaller than 32).
Sizes go in steps of ``CHUNK_STEP`` tokens, so a chunk is not rounded far below what
fits (the step and the budget were chosen by ``radixchat bench fairness``:
docs/benchmarks.md).
Chunks are not made smaller than they must be: each one costs the long prompt one decode
step of the others, so its time to first token stays near its solo prefill.
"""

from __future__ import annotations

from core.engine import generation

DECODE_WAIT_S = 0.75  # the longest a running stream's decode step should wait for a prefill chunk
# the longest a newly arrived prompt should wait for the chunk in flight while nobody decodes
IDLE_WAIT_S = 0.75
MIN_CHUNK = 32  # tokens: the smallest chunk
CHUNK_STEP = 8  # tokens: chunk sizes are multiples of this
MARGIN = 0.8  # aim below the budget: the next chunk is deeper, so a little slower per token


class ChunkPacer:
    """Sizes prefill chunks from the measured prefill rate (engine thread only)."""

    def __init__(
        self,
        budget_s: float = DECODE_WAIT_S,
        largest: int | None = None,
        idle_budget_s: float | None = None,
    ):
        self.budget_s = budget_s
        self.largest = largest  # None: generation.PREFILL_CHUNK
        self.idle_budget_s = idle_budget_s  # None: the largest chunk while nobody decodes
        self.seconds_per_token: float | None = None  # the last measured chunk's

    def size(self, decoding: bool) -> int:
        """Tokens for the next chunk: the most that fits the budget while others are
        ``decoding``, else the most that fits the idle budget (the largest chunk without one)."""
        largest = self.largest or generation.PREFILL_CHUNK
        budget = self.budget_s if decoding else self.idle_budget_s
        if budget is None:
            return largest
        if self.seconds_per_token is None:  # nothing measured yet: a small first chunk measures it
            return min(MIN_CHUNK, largest) if decoding else largest
        fits = int(budget * MARGIN / self.seconds_per_token)
        return max(min(MIN_CHUNK, largest), min(largest, fits // CHUNK_STEP * CHUNK_STEP))

    def batch_tokens(self, decoding: bool, idle: int) -> int:
        """Padded tokens (rows x the longest row) one batched prefill of several waiting
        prompts may take (``core.engine.batch_prefill``): what fits the budget while others
        are ``decoding`` (no cap at the largest chunk: the budget is the bound), else at most
        ``idle``, and what fits the idle budget where there is one."""
        if not decoding:
            if self.idle_budget_s is None or self.seconds_per_token is None:
                return idle
            return min(
                idle, max(MIN_CHUNK, int(self.idle_budget_s * MARGIN / self.seconds_per_token))
            )
        if self.seconds_per_token is None:
            return MIN_CHUNK
        return max(MIN_CHUNK, int(self.budget_s * MARGIN / self.seconds_per_token))

    def observe(self, tokens: int, seconds: float) -> None:
        """A chunk of ``tokens`` took ``seconds``. Short calls (a prompt's last few tokens)
        are mostly fixed cost and say little about the rate: they are not counted."""
        if tokens >= MIN_CHUNK and seconds > 0:
            self.seconds_per_token = seconds / tokens
