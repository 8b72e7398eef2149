"""How long a draft to propose (``core.engine.drafts``): the length that takes the most reply
tokens per second, from the request's acceptance so far and the measured cost of a step.

A verifying forward over a draft of ``k`` tokens reads ``k + 1`` tokens. On a GPU that
costs about one plain step, so the longest draft the acceptance allows pays. On a CPU the
forward is bound by compute as much as by reading the weights, and its cost grows with
``k`` (measured on SmolLM2 float32 over a 4k prefix, 2 busy cores: docs/benchmarks.md),
so a long draft of which only a few tokens are taken is slower than a short one, or than
no draft at all.

- :class:`StepCosts` (one per scheduler: the model and the machine) holds the seconds a
  decode step of each draft length took, measured by the scheduler as it runs (0: a plain
  step), a moving average per length; a length not measured yet is read off the line
  through the measured ones.
- :class:`Acceptance` (one per request) holds how often a draft's ``i``-th token was taken
  when the tokens before it were, decayed so that it follows the text as it changes.

:func:`best_length` picks the length ``k`` with the most expected reply tokens per second,
``(1 + sum of P(the first i draft tokens are taken), i <= k) / cost(k)``, and 0 when a
plain step is expected to be faster.
"""

from __future__ import annotations

AVERAGE = 0.25  # weight of a new measurement in a length's moving average
DECAY = 0.9  # weight of the acceptance history at each new draft
PRIOR, PRIOR_WEIGHT = 0.5, 0.2  # a position's acceptance before drafts reached it, as drafts


class StepCosts:
    """Seconds of a decode step by draft length (0: a plain step), measured as it runs."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}

    def record(self, length: int, seconds: float) -> None:
        held = self.seconds.get(length)
        self.seconds[length] = seconds if held is None else held + AVERAGE * (seconds - held)

    def known(self) -> bool:
        """Whether a plain step and at least one draft length were measured."""
        return 0 in self.seconds and len(self.seconds) > 1

    def estimate(self, length: int) -> float:
        """The seconds of a step of ``length``: measured, else interpolated between the
        nearest measured lengths, else on the least-squares line through them all (never
        below the plain step). Call only once :meth:`known`."""
        held = self.seconds.get(length)
        if held is not None:
            return held
        below = max((k for k in self.seconds if k < length), default=None)
        above = min((k for k in self.seconds if k > length), default=None)
        if below is not None and above is not None:
            low, high = self.seconds[below], self.seconds[above]
            return low + (high - low) * (length - below) / (above - below)
        xs, ys = list(self.seconds), list(self.seconds.values())
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        spread = sum((x - mean_x) ** 2 for x in xs)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
        return max(self.seconds[0], mean_y + slope * (length - mean_x))


class Acceptance:
    """One request's drafts so far: for each position ``i`` (1-based), how many drafts
    reached it (their first ``i - 1`` tokens were taken and they had an ``i``-th) and of
    those how many had it taken, decayed per draft."""

    def __init__(self, longest: int):
        self.reached = [0.0] * (longest + 1)
        self.taken = [0.0] * (longest + 1)

    def observe(self, proposed: int, accepted: int) -> None:
        for i in range(1, len(self.reached)):
            self.reached[i] *= DECAY
            self.taken[i] *= DECAY
        for i in range(1, min(proposed, accepted + 1, len(self.reached) - 1) + 1):
            self.reached[i] += 1.0
            if i <= accepted:
                self.taken[i] += 1.0

    def expected(self, longest: int) -> list[float]:
        """Expected reply tokens of a step with a draft of ``k`` tokens, ``k = 0..longest``:
        the model's own token, plus each draft token times the chance that it and all before
        it are taken. A position no draft reached yet takes the rate of the one before."""
        out, survive, rate = [1.0], 1.0, PRIOR
        for i in range(1, longest + 1):
            if i < len(self.reached) and self.reached[i] > 0.05:
                rate = (self.taken[i] + PRIOR * PRIOR_WEIGHT) / (self.reached[i] + PRIOR_WEIGHT)
            survive *= rate
            out.append(out[-1] + survive)
        return out


def best_length(acceptance: Acceptance, costs: StepCosts, longest: int) -> int:
    """The draft length (0 to ``longest``) with the most expected tokens per second."""
    expected = acceptance.expected(longest)
    return max(range(longest + 1), key=lambda k: expected[k] / costs.estimate(k))
