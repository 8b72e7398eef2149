"""Every text model type of the installed mlx-lm gets the radix cache and the disk tier.

For each family of ``tests/kvcache/model_families.py`` (a tiny random-weight model of every
module in ``mlx_lm/models/`` that is a text model): two chat turns in one engine, the
second served in part from RAM; a third turn in a new engine on the same data folder
(a restart), served in part from disk; that turn again once other requests have pushed it
out of the recent requests' own caches (served from the page pool and snapshots); and
every reply, token for token, the reply the same prompt gets with the cache off
(``use_cache=False``, what ``--no-cache`` sends), greedy. Every module of the installed
mlx-lm is either a family or skipped with its reason (``SKIPPED``), so a new mlx-lm's new
model type fails here until it has a config.

Marked ``model_matrix`` (CI runs it; ``pytest -m "not model_matrix"`` skips it locally).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import mlx.core as mx
import mlx_lm.models
import pytest

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import DoneEvent, GenerationRequest, SamplingParams, TokenEvent
from tests.kvcache.family_weights import write_family
from tests.kvcache.model_families import FAMILIES, NEEDS_METAL, SKIPPED

pytestmark = pytest.mark.model_matrix

REPLY_TOKENS = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=REPLY_TOKENS)
# Byte-level prompts (the tiny tokenizer's ids are bytes). The first spans several 16-token
# pages and is longer than the families' sliding windows (16); the follow-ups are short, so
# what a turn computes after the cached part is shorter than a window and a recurrent
# state's memory: a wrong snapshot or a wrong page changes the reply.
FIRST = "You are a careful assistant. Plan a day in Lyon, with a museum and a long lunch."
FOLLOW_UPS = ("Why?", "More.")
OTHERS = (
    "Unrelated question one.",
    "Unrelated question two.",
)  # push a follow-up out of the hot caches


@dataclass(frozen=True)
class Turn:
    prompt: tuple[int, ...]
    reply: tuple[int, ...]
    cached: int
    restored: int


def run(engine: Engine, prompt: tuple[int, ...], use_cache: bool = True) -> Turn:
    request = GenerationRequest(
        prompt_tokens=prompt, sampling=GREEDY, session="chat", use_cache=use_cache
    )
    reply: list[int] = []
    done = None
    for event in engine.stream(request):
        if isinstance(event, TokenEvent):
            reply += event.token_ids
        elif isinstance(event, DoneEvent):
            done = event
    assert done is not None, f"the request ended without a reply: {event}"
    return Turn(prompt, tuple(reply), done.stats.cached_tokens, done.stats.restored_tokens)


def start(data, model) -> Engine:
    engine = Engine(data, str(model), config=EngineConfig(pool_tokens=4096)).start()
    engine.wait_ready(120)
    return engine


def follow_up(turn: Turn, text: str) -> tuple[int, ...]:
    return turn.prompt + turn.reply + tuple(text.encode())


def test_every_module_is_a_family_or_skipped_with_a_reason():
    folder = os.path.dirname(mlx_lm.models.__file__)
    modules = {
        name[:-3] for name in os.listdir(folder) if name.endswith(".py") and name != "__init__.py"
    }
    assert not set(FAMILIES) & set(SKIPPED)
    assert modules - set(FAMILIES) - set(SKIPPED) == set(), (
        "new mlx-lm model types: give them a config"
    )
    assert set(FAMILIES) | set(SKIPPED) <= modules, "families of model types this mlx-lm lacks"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cached_and_restored_replies_equal_uncached_ones(family, tmp_path):
    if family in NEEDS_METAL and not mx.metal.is_available():
        pytest.skip(f"{family}: {NEEDS_METAL[family]}; this machine has no Metal")
    model = write_family(tmp_path / family, family)
    data = tmp_path / "data"
    engine = start(data, model)
    try:
        first = run(engine, tuple(FIRST.encode()))
        second = run(engine, follow_up(first, FOLLOW_UPS[0]))
        engine.flush_disk_cache()
    finally:
        engine.shutdown()
    engine = start(data, model)  # a restart: RAM is empty, the disk holds the chat
    try:
        third = run(engine, follow_up(second, FOLLOW_UPS[1]))
        for text in OTHERS:  # the last requests' own caches are kept a while: not these
            run(engine, tuple(text.encode()))
        again = run(engine, third.prompt)  # regenerate: gathered from the pool (and snapshots)
        uncached = [run(engine, turn.prompt, use_cache=False) for turn in (first, second, third)]
        stats = engine.stats().cache
    finally:
        engine.shutdown()
    assert stats.enabled, stats.disabled_reason
    assert [t.reply for t in uncached] == [first.reply, second.reply, third.reply]
    assert again.reply == third.reply
    assert all(t.cached == t.restored == 0 for t in uncached)
    assert second.cached >= len(first.prompt) - 1 and second.restored == 0  # turn 2 from RAM
    assert third.restored >= len(second.prompt) - 1 and third.cached == 0  # turn 3 from disk
    assert again.cached >= len(second.prompt) - 1 and again.restored == 0
