"""Drafts (core/engine/drafts.py): prompt lookup in a request's own text, the tree as a
second source, a draft model's greedy guesses, and the draft length adapting to
acceptance down to none."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from core.engine import drafts
from core.engine.drafts import Drafter, DraftModel, PromptLookup
from tests.core.engine.helpers import load_tiny


def test_prompt_lookup_follows_the_latest_occurrence_of_the_longest_run():
    lookup = PromptLookup([1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7])
    lookup.extend([2, 3, 4])
    assert lookup.follow(2) == [6, 7]  # the later of the two runs 2 3 4
    lookup.extend([5])
    assert lookup.follow(3) == [9, 2, 3]  # 3 4 5 only at the start
    assert PromptLookup([1, 2, 3]).follow(4) == []


def test_prompt_lookup_falls_back_to_shorter_runs():
    lookup = PromptLookup([8, 9, 1, 7, 8, 9, 5], ngrams=(4, 3, 2))
    lookup.extend([0, 8, 9])
    assert lookup.follow(1) == [5]  # "0 8 9" and "1 0 8 9" are new, "8 9" was followed by 5


def test_drafter_asks_the_tree_when_its_own_text_has_nothing():
    asked = []

    def tree(context, limit):
        asked.append(list(context[-2:]))
        return [40, 41, 42][:limit]

    drafter = Drafter([1, 2, 3], tree=tree)
    assert drafter.worth_a_look()
    assert drafter.propose(2) == [40, 41]
    assert asked[-1] == [2, 3]
    own = Drafter([1, 2, 3, 1, 2], tree=tree)
    assert own.propose(10) == [3, 1, 2][: drafts.FIRST_LENGTH]


def test_length_grows_with_whole_drafts_and_shrinks_to_what_was_taken():
    drafter = Drafter([1, 2, 3, 1, 2, 3, 1, 2])
    assert drafter.length == drafts.FIRST_LENGTH
    drafter.observe(4, 4)
    assert drafter.length == min(drafts.MAX_LENGTH, 2 * drafts.FIRST_LENGTH)
    for _ in range(5):
        drafter.observe(drafter.length, drafter.length)
    assert drafter.length == drafts.MAX_LENGTH
    drafter.observe(drafts.MAX_LENGTH, 2)
    assert drafter.length == 3
    assert len(drafter.propose(100)) <= 3


def test_drafts_that_keep_failing_pause_drafting_for_longer_each_time():
    drafter = Drafter([1, 2, 1, 2, 1, 2])
    for _ in range(drafts.MISSES_TO_PAUSE):
        assert drafter.worth_a_look()
        drafter.observe(2, 0)
    skipped = 0
    while not drafter.worth_a_look():
        skipped += 1
    assert skipped == drafts.FIRST_PAUSE
    for _ in range(drafts.MISSES_TO_PAUSE):
        drafter.observe(2, 0)
    skipped = 0
    while not drafter.worth_a_look():
        skipped += 1
    assert skipped == 2 * drafts.FIRST_PAUSE
    drafter.observe(2, 1)  # one accepted: the next pause is short again
    assert drafter.next_pause == drafts.FIRST_PAUSE


def test_text_without_repeats_is_not_worth_a_look():
    assert not Drafter([1, 2, 3, 4, 5]).worth_a_look()


def test_draft_model_guesses_what_it_would_write_and_follows_rewinds(tmp_path_factory):
    loaded = load_tiny(tmp_path_factory, "llama", num_layers=2)
    model = DraftModel(loaded.model, lambda: make_prompt_cache(loaded.model))
    prompt = [5, 6, 7, 8, 9]
    guess = model.follow(prompt, 4)
    assert len(guess) == 4
    assert model.seen == prompt + guess[:-1]
    # the same greedy tokens, a token at a time on fresh caches
    caches = make_prompt_cache(loaded.model)
    logits = loaded.model(mx.array(prompt)[None], cache=caches)[0, -1]
    alone = []
    for _ in range(4):
        alone.append(mx.argmax(logits).item())
        logits = loaded.model(mx.array(alone[-1:])[None], cache=caches)[0, -1]
    assert guess == alone
    # only the first two guesses taken, then another token: it rewinds to them
    again = model.follow([*prompt, *guess[:2], 3], 2)
    assert model.seen[: len(prompt) + 3] == [*prompt, *guess[:2], 3]
    assert len(again) == 2
    assert model.caches[0].offset == len(model.seen)
