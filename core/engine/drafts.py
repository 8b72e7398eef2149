"""Drafts for speculative decoding: guesses of a reply's next tokens, checked by the model
in one forward (``core.engine.speculation``).

Where a guess comes from:

- :class:`PromptLookup`: the request's own prompt and reply so far (prompt lookup
  decoding). When the reply's last ``n`` tokens occurred before, the tokens that followed
  them then are the guess: an agent rewriting a file it was given, JSON passed through.
- the radix tree (``kvcache.continuations``): what followed the same tokens in anything
  cached in the request's namespace (a regenerated reply, another turn's text).
- :class:`DraftModel`: a small model of the same vocabulary, decoding greedily ahead
  (``--draft-model``).

:class:`Drafter` is one request's: it asks its sources in that order and picks the draft
length that takes the most reply tokens per second (``core.engine.draft_length``: its
acceptance so far times the step costs the scheduler measures), none when a plain step is
expected to be faster, and none for a while after drafts keep failing, so text that never
repeats pays almost nothing. Until the costs are measured the length follows acceptance
alone (longer while drafts are taken whole, shorter when they are not).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import mlx.core as mx

from core.engine.draft_length import Acceptance, StepCosts, best_length
from core.engine.generation import vocab_size
from core.errors import UserError
from core.mlx_lm_compat import generation_stream

NGRAMS = (4, 3, 2)  # run lengths matched in the request's own text, the longest first
FIRST_LENGTH = 4  # tokens drafted at first
MAX_LENGTH = 16  # tokens drafted at most
MISSES_TO_PAUSE = 3  # drafts in a row of which nothing was accepted, then a pause
FIRST_PAUSE, MAX_PAUSE = 8, 128  # decode steps without drafting (doubling while they fail)


class PromptLookup:
    """Where each run of ``n`` tokens of one request's text was last followed by another
    token: updated a token at a time, looked up in constant time."""

    def __init__(self, tokens: Sequence[int], ngrams: Sequence[int] = NGRAMS):
        self.ngrams = tuple(sorted(ngrams, reverse=True))
        self.tokens: list[int] = []
        self._after: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.ngrams}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            at = len(self.tokens)  # the new token's index: it follows each run ending before it
            for n, after in self._after.items():
                if at >= n:
                    after[tuple(self.tokens[at - n : at])] = at
            self.tokens.append(int(token))

    def follow(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the text's last run of ``n`` tokens where it
        occurred before (the longest ``n`` that did), else []."""
        tokens = self.tokens
        for n in self.ngrams:
            if len(tokens) <= n:
                continue
            at = self._after[n].get(tuple(tokens[-n:]))
            if at is not None:
                return tokens[at : at + limit]
        return []


class DraftModel:
    """A small model of the same vocabulary that drafts by decoding greedily ahead, on caches
    of its own that follow the request's accepted tokens (engine thread only)."""

    def __init__(self, model, make_caches: Callable[[], list]):
        self.model = model
        self.caches = make_caches()
        self.seen: list[int] = []  # what ``caches`` hold

    def follow(self, tokens: Sequence[int], limit: int) -> list[int]:
        """``limit`` tokens the draft model would write after ``tokens``."""
        if limit < 1 or not tokens:
            return []
        common = 0
        for a, b in zip(self.seen, tokens):
            if a != b:
                break
            common += 1
        common = min(common, len(tokens) - 1)  # the last token is fed, for its logits
        if len(self.seen) > common:
            for cache in self.caches:
                cache.trim(len(self.seen) - common)
        feed = list(tokens[common:])
        out: list[int] = []
        with mx.stream(generation_stream):
            while len(feed) > 512:  # a prompt's first sight: in chunks, as a prefill
                self.model(mx.array(feed[:512])[None], cache=self.caches)
                mx.eval([c.state for c in self.caches])
                feed = feed[512:]
            for _ in range(limit):
                logits = self.model(mx.array(feed)[None], cache=self.caches)[0, -1]
                feed = [mx.argmax(logits).item()]
                out.append(feed[0])
        self.seen = list(tokens) + out[:-1]
        return out


class Drafter:
    """One request's drafts: its sources asked in order, the length adapted to acceptance.

    ``tree`` (``(context, limit) -> tokens``) reads the request's namespace in the radix
    tree; ``model`` is a :class:`DraftModel` (``--speculative draft``), asked instead of
    the lookups; ``costs``, the scheduler's measured step costs (None: acceptance alone)."""

    def __init__(
        self,
        tokens: Sequence[int],
        tree: Callable[[Sequence[int], int], list[int]] | None = None,
        model: DraftModel | None = None,
        costs: StepCosts | None = None,
    ):
        self.lookup = PromptLookup(tokens)
        self.tree = tree
        self.model = model
        self.costs = costs
        self.acceptance = Acceptance(MAX_LENGTH)
        self.length = FIRST_LENGTH  # the length by acceptance alone (costs not measured yet)
        self.probe = True  # the next draft is tried though the costs advise none
        self.misses = 0  # drafts in a row with nothing accepted
        self.pause = 0  # decode steps left without drafting
        self.next_pause = FIRST_PAUSE

    def extend(self, tokens: Sequence[int]) -> None:
        """The request took ``tokens`` (its reply goes on)."""
        self.lookup.extend(tokens)

    @property
    def tokens(self) -> list[int]:
        return self.lookup.tokens

    def worth_a_look(self) -> bool:
        """Whether the next step should draft: not paused, and (for the lookups) the text so
        far has a continuation to offer. A step told no decodes as without speculation."""
        if self.pause:
            self.pause -= 1
            return False
        if self.costs is not None and 0 not in self.costs.seconds:
            return False  # a few plain steps first: what drafts are weighed against
        if self.model is not None:
            return True
        return bool(self.lookup.follow(1)) or bool(
            self.tree is not None and self.tree(self.tokens, 1)
        )

    def propose(self, limit: int) -> list[int]:
        """A draft of at most ``min(limit, length)`` tokens to follow the text so far."""
        if self.costs is not None and self.costs.known():
            length = best_length(self.acceptance, self.costs, min(limit, MAX_LENGTH))
            if length == 0:
                if not self.probe:  # a plain step is expected to be faster: try again later
                    self._pause()
                    return []
                length = FIRST_LENGTH
            limit, self.probe = min(limit, length), False
        else:
            limit = min(limit, self.length)
        if limit < 1:
            return []
        if self.model is not None:
            return self.model.follow(self.tokens, limit)
        draft = self.lookup.follow(limit)
        if not draft and self.tree is not None:
            draft = self.tree(self.tokens, limit)
        return draft

    def observe(self, proposed: int, accepted: int) -> None:
        """How much of a draft of ``proposed`` tokens the model accepted."""
        self.acceptance.observe(proposed, accepted)
        if accepted == proposed:
            self.length = min(MAX_LENGTH, self.length * 2)
        else:
            self.length = max(1, min(self.length, accepted + 1))
        if accepted:
            self.misses, self.next_pause = 0, FIRST_PAUSE
            return
        self.misses += 1
        if self.misses >= MISSES_TO_PAUSE:
            self._pause()
            self.length = FIRST_LENGTH

    def _pause(self) -> None:
        """No drafts for the next steps (twice as many as last time, up to ``MAX_PAUSE``);
        the draft after them is tried whatever the costs advise (the text may repeat now)."""
        self.pause, self.misses, self.probe = self.next_pause, 0, True
        self.next_pause = min(MAX_PAUSE, self.next_pause * 2)


def draft_model(spec: str | None, data_root: Path, loaded):
    """The draft model ``spec`` names, loaded for ``loaded`` (engine thread); None without
    one. A :class:`UserError` when it cannot draft for ``loaded``: another vocabulary."""
    if spec is None:
        return None
    from core.models.load.loader import load_model

    draft = load_model(spec, data_root)
    ours = vocab_size(loaded.model, loaded.config)
    theirs = vocab_size(draft.model, draft.config)
    if ours != theirs:
        raise UserError(
            f"the draft model {draft.info.name} has a vocabulary of {theirs} tokens and "
            f"{loaded.info.name} one of {ours}: a draft model shares the model's tokenizer"
        )
    return draft.model
