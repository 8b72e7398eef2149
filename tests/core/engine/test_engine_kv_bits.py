"""Quantized KV (``kv_bits``) in the engine: cached replies are the uncached replies at the
same KV format, token by token, in RAM, decoding together, and after a restart from disk;
a store written at one format is a miss at another."""

from __future__ import annotations

import pytest

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.scheduler import Scheduler
from core.engine.types import ChatMessage, DoneEvent, GenerationRequest, SamplingParams
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.builder import build_kv_cache
from kvcache.kv_format import KVFormat
from kvcache.tiered import TieredCache
from tests.core.engine.helpers import done, finish, handle, load_tiny, run_alone, start
from tests.core.engine.token_log import TokenLog

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
PROMPT = "The quick brown fox jumps over the lazy dog, again and again and again. "


@pytest.fixture(scope="module", params=["llama", "sliding", "recurrent"])
def loaded(request, tmp_path_factory):
    """A tiny model of every cache kind, head dim 32 (groups of 32 divide it)."""
    return load_tiny(
        tmp_path_factory,
        request.param,
        num_layers=2 if request.param == "llama" else 4,
        hidden_size=128,
    )


def scheduler(loaded, kv_format: KVFormat, cache: bool = True) -> Scheduler:
    build = build_kv_cache(
        loaded.model,
        weight_bytes=0,
        pool_tokens=4096,
        kv_format=kv_format,
        disable=not cache,
    )
    return Scheduler(loaded, TieredCache(loaded.model, build))


@pytest.mark.parametrize("bits", [8, 4])
def test_cached_replies_are_the_uncached_ones_at_the_same_format(loaded, bits, monkeypatch):
    kv_format = KVFormat(bits, 32)
    log = TokenLog(monkeypatch)
    turns = [PROMPT, PROMPT + "What comes next?", PROMPT + "What comes next? And then?"]
    cached = scheduler(loaded, kv_format)
    for text in turns:
        run_alone(cached, handle(text, 16))
    with_cache = log.by_prompt()
    assert done_cached(cached) > 0  # the later turns were served from the tree
    log.clear()
    plain = scheduler(loaded, kv_format, cache=False)
    for text in turns:
        run_alone(plain, handle(text, 16))
    assert log.by_prompt() == with_cache


def done_cached(s: Scheduler) -> int:
    return s.cache.ram.stats().hit_tokens


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_requests_decode_together_as_they_do_alone(loaded, bits, monkeypatch):
    kv_format = KVFormat(bits, 32)
    log = TokenLog(monkeypatch)
    texts = [PROMPT + "one", "a shorter prompt", PROMPT + PROMPT + "three"]
    together = scheduler(loaded, kv_format, cache=False)
    handles = [handle(text, 16) for text in texts]
    for h in handles:
        start(together, h)  # each joins the batch the others decode in
    finish(together)
    assert all(isinstance(done(h), DoneEvent) for h in handles)
    batched = log.by_prompt()
    log.clear()
    alone = scheduler(loaded, kv_format, cache=False)
    for text in texts:
        run_alone(alone, handle(text, 16))
    assert log.by_prompt() == batched


def chat_two_turns(engine: Engine, session: str):
    history = [ChatMessage("user", "first question here, with some words")]
    d1 = last(engine, history, session)
    history += [ChatMessage("assistant", d1.text), ChatMessage("user", "second one")]
    return d1, last(engine, history, session), history


def last(engine: Engine, history: list, session: str | None) -> DoneEvent:
    request = GenerationRequest(messages=tuple(history), sampling=GREEDY, session=session)
    event = list(engine.stream(request))[-1]
    assert isinstance(event, DoneEvent), event
    return event


def test_after_a_restart_quantized_pages_give_the_uncached_reply(tmp_path, monkeypatch):
    """8-bit pages saved by one engine are restored by the next at 8 bits (as they are) and
    the reply is the uncached one at 8 bits; an engine at full precision or 4 bits finds
    nothing of them on disk and computes the prompt."""
    path = write_tiny_model(
        tmp_path / "m", TinyModelSpec(kind="sliding", num_layers=4, hidden_size=128)
    )
    log = TokenLog(monkeypatch)

    def engine(data, bits, **options):
        config = EngineConfig(pool_tokens=4096, kv_bits=bits, kv_group_size=32, **options)
        e = Engine(data, str(path), config=config)
        e.start().wait_ready(60)
        return e

    writer = engine(tmp_path / "data", 8)
    d1, _, history = chat_two_turns(writer, "s")
    writer.flush_disk_cache()
    writer.shutdown()
    log.clear()
    reader = engine(tmp_path / "data", 8)
    try:
        again = last(reader, history, "s")
    finally:
        reader.shutdown()
    assert again.stats.restored_tokens >= d1.stats.prompt_tokens + d1.stats.completion_tokens - 1
    plain = engine(tmp_path / "plain", 8, use_cache=False)
    try:
        uncached = last(plain, history, None)
    finally:
        plain.shutdown()
    restarted, from_scratch = log.started()
    assert restarted == from_scratch and again.text == uncached.text
    for other in (None, 4):
        e = engine(tmp_path / "data", other)
        try:
            assert last(e, history, "s").stats.restored_tokens == 0
        finally:
            e.shutdown()
