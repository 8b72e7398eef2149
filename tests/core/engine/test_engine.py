"""The engine thread on a tiny generated model: streaming, sampling, stops, cancel, cache reuse."""

from __future__ import annotations

import threading

import pytest

from core.engine import generation
from core.engine.engine import Engine, RequestHandle
from core.engine.types import (
    ChatMessage,
    DoneEvent,
    ErrorEvent,
    GenerationRequest,
    ProgressEvent,
    RequestStats,
    SamplingParams,
    TokenEvent,
)
from core.errors import ErrorKind, UserError
from tests.core.engine.helpers import last_done, start_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):
    eng = start_engine(tmp_path_factory.mktemp("data"), tiny_model, pool_tokens=8192)
    yield eng
    eng.shutdown()


def ask(text: str, sampling: SamplingParams = GREEDY, **kw) -> GenerationRequest:
    return GenerationRequest(messages=(ChatMessage("user", text),), sampling=sampling, **kw)


def collect(engine: Engine, request: GenerationRequest):
    events = list(engine.stream(request))
    assert isinstance(events[-1], (DoneEvent, ErrorEvent)), events[-1]
    return events


def test_stream_tokens_then_done_with_stats(engine):
    events = collect(engine, ask("hello", use_cache=False))
    done = last_done(events)
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert text == done.text and len(text) > 0
    stats = done.stats
    assert stats.completion_tokens == 12 and stats.finish_reason == "length"
    assert stats.prompt_tokens == stats.computed_tokens > 0
    assert stats.cached_tokens == 0 and stats.restored_tokens == 0
    assert stats.ttft_s > 0 and stats.decode_tps > 0
    assert any(isinstance(e, ProgressEvent) for e in events)


def test_model_info_is_plain(engine):
    info = engine.model_info
    assert info.model_type == "llama" and info.num_layers == 2
    assert len(info.fingerprint) == 64 and info.weight_bytes > 0 and info.context_length == 512


def test_greedy_is_deterministic(engine):
    a = last_done(collect(engine, ask("same prompt", use_cache=False))).text
    b = last_done(collect(engine, ask("same prompt", use_cache=False))).text
    assert a == b


def test_seed_reproduces_sampling(engine):
    hot = SamplingParams(temperature=1.5, seed=7, max_tokens=24)
    a = last_done(collect(engine, ask("seeded", hot, use_cache=False))).text
    b = last_done(collect(engine, ask("seeded", hot, use_cache=False))).text
    other = SamplingParams(temperature=1.5, seed=8, max_tokens=24)
    c = last_done(collect(engine, ask("seeded", other, use_cache=False))).text
    assert a == b
    assert a != c


def test_top_k_one_equals_greedy(engine):
    greedy = last_done(collect(engine, ask("topk", use_cache=False))).text
    top1 = SamplingParams(temperature=1.0, top_k=1, max_tokens=12, seed=3)
    assert last_done(collect(engine, ask("topk", top1, use_cache=False))).text == greedy


def test_repetition_penalty_changes_greedy_output(engine):
    long = SamplingParams(temperature=0.0, max_tokens=40)
    plain = last_done(collect(engine, ask("repeat", long, use_cache=False))).text
    penalised = SamplingParams(temperature=0.0, max_tokens=40, repetition_penalty=5.0)
    assert last_done(collect(engine, ask("repeat", penalised, use_cache=False))).text != plain


def test_stop_string_cuts_the_reply(engine):
    full = last_done(
        collect(
            engine, ask("stops", SamplingParams(temperature=0.0, max_tokens=30), use_cache=False)
        )
    )
    stop = full.text[5:7]
    cut_at = full.text.find(stop)
    params = SamplingParams(temperature=0.0, max_tokens=30, stop=(stop,))
    events = collect(engine, ask("stops", params, use_cache=False))
    done = last_done(events)
    assert done.text == full.text[:cut_at]
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == done.text
    assert done.stats.finish_reason == "stop"


def test_a_reply_ending_on_a_possible_stop_start_keeps_its_tail(engine):
    params = SamplingParams(temperature=0.0, max_tokens=12)
    full = last_done(collect(engine, ask("tails", params, use_cache=False)))
    held = SamplingParams(temperature=0.0, max_tokens=12, stop=(full.text[-1] + "\x00never",))
    events = collect(engine, ask("tails", held, use_cache=False))
    assert last_done(events).text == full.text  # the last character was held back, then shown
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == full.text


def test_token_ids_outside_the_vocabulary_are_a_clear_error(engine):
    from core.models.tiny_model import VOCAB_SIZE

    for bad in (VOCAB_SIZE, 10**6):
        events = collect(engine, GenerationRequest(prompt_tokens=(1, 2, bad), use_cache=False))
        error = next(e for e in events if isinstance(e, ErrorEvent))
        assert error.user_error and "vocabulary" in error.message and "\n" not in error.message
    huge_top_k = SamplingParams(temperature=1.0, top_k=10**6, max_tokens=3, seed=1)
    assert (
        last_done(collect(engine, ask("any", huge_top_k, use_cache=False))).stats.completion_tokens
        == 3
    )


def test_max_tokens_and_length_reason(engine):
    done = last_done(
        collect(engine, ask("short", SamplingParams(temperature=0, max_tokens=3), use_cache=False))
    )
    assert done.stats.completion_tokens == 3 and done.stats.finish_reason == "length"


def test_cancel_mid_decode(engine):
    handle = engine.submit(
        ask("long reply", SamplingParams(temperature=0, max_tokens=400), use_cache=False)
    )
    seen = []
    for event in handle.events(timeout=60):
        seen.append(event)
        if isinstance(event, TokenEvent) and len(seen) > 3:
            handle.cancel()
    done = last_done(seen)
    assert done.stats.finish_reason == "cancelled"
    assert done.stats.completion_tokens < 400


def test_cancel_mid_prefill(engine, monkeypatch):
    monkeypatch.setattr(generation, "PREFILL_CHUNK", 8)
    handle = engine.submit(
        GenerationRequest(prompt_text="x" * 400, sampling=GREEDY, use_cache=False)
    )
    events = []
    for event in handle.events(timeout=60):
        events.append(event)
        if isinstance(event, ProgressEvent) and event.done > 0:
            handle.cancel()
    done = last_done(events)
    assert done.stats.finish_reason == "cancelled"
    assert done.stats.completion_tokens == 0
    assert not any(isinstance(e, TokenEvent) for e in events)
    progress = [e.done for e in events if isinstance(e, ProgressEvent)]
    assert max(progress) < 400


def test_prompt_over_context_is_a_clear_error(engine):
    events = collect(engine, GenerationRequest(prompt_text="y" * 600, sampling=GREEDY))
    assert isinstance(events[-1], ErrorEvent)
    assert "context of 512" in events[-1].message and events[-1].kind is ErrorKind.CONTEXT_TOO_LONG


def test_engine_survives_errors(engine):
    collect(engine, GenerationRequest(prompt_text="y" * 600, sampling=GREEDY))
    assert last_done(collect(engine, ask("still alive"))).stats.completion_tokens > 0


def test_follow_up_turn_reuses_the_cache_and_matches_recompute(engine):
    first = ask("first question", session="s-cache")
    d1 = last_done(collect(engine, first))
    history = (
        ChatMessage("user", "first question"),
        ChatMessage("assistant", d1.text),
        ChatMessage("user", "second question"),
    )
    d2 = last_done(
        collect(engine, GenerationRequest(messages=history, sampling=GREEDY, session="s-cache"))
    )
    fresh = last_done(
        collect(engine, GenerationRequest(messages=history, sampling=GREEDY, use_cache=False))
    )
    # the second turn only computes what the first turn did not see
    assert d2.stats.cached_tokens >= d1.stats.prompt_tokens
    assert d2.stats.computed_tokens == d2.stats.prompt_tokens - d2.stats.cached_tokens
    assert fresh.stats.cached_tokens == 0
    assert d2.text == fresh.text


def test_requests_from_many_threads_are_served_in_turn(engine):
    results: dict[int, str] = {}

    def client(i: int) -> None:
        results[i] = last_done(collect(engine, ask(f"client {i}", use_cache=False))).text

    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1, 2]
    assert results[0] == last_done(collect(engine, ask("client 0", use_cache=False))).text


def test_load_failure_keeps_the_previous_model(engine, tmp_path):
    before = engine.model_info
    with pytest.raises(UserError, match="no model at"):
        engine.load(str(tmp_path / "missing.gguf"), timeout=30)
    assert engine.model_info == before
    assert last_done(collect(engine, ask("after failed load"))).stats.completion_tokens > 0


def test_failed_first_load_reports_on_wait_ready(tmp_path):
    eng = Engine(tmp_path, str(tmp_path / "nothing-here")).start()
    try:
        with pytest.raises(UserError, match="no model at"):
            eng.wait_ready(timeout=30)
        events = list(eng.stream(ask("hi")))
        assert isinstance(events[-1], ErrorEvent)
    finally:
        eng.shutdown()


EXIT_SCRIPT = """
import sys
from pathlib import Path
import core
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import GenerationRequest, SamplingParams
engine = Engine(Path(sys.argv[1]), sys.argv[2], config=EngineConfig(pool_tokens=1024)).start()
engine.wait_ready()
request = GenerationRequest(prompt_text="hi", sampling=SamplingParams(temperature=0, max_tokens=4))
print(list(engine.stream(request))[-1].stats.finish_reason)
engine.shutdown()
"""


def test_process_exits_cleanly_after_the_engine_ran(tiny_model, tmp_path):
    """MLX's thread-local destructors must not run during interpreter shutdown (abort 134)."""
    import subprocess
    import sys

    for _ in range(4):  # the race showed up in about half of the runs before the fix
        result = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT, str(tmp_path), str(tiny_model)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-500:]
        assert result.stdout.strip() == "length"


def test_empty_prompt_is_a_clear_error(engine):
    events = collect(engine, GenerationRequest(prompt_text="", sampling=GREEDY))
    assert isinstance(events[-1], ErrorEvent) and "empty prompt" in events[-1].message


def test_count_tokens_is_the_prompt_a_request_would_have(engine):
    request = ask("how many tokens is this?")
    counted = engine.count_tokens(request)
    assert counted == last_done(collect(engine, request)).stats.prompt_tokens > 0
    assert engine.count_tokens(GenerationRequest(prompt_tokens=(1, 2, 3))) == 3
    with pytest.raises(UserError):
        engine.count_tokens(GenerationRequest())


def test_a_handle_wakes_its_reader_and_hands_over_what_arrived():
    handle = RequestHandle(GenerationRequest(prompt_text="hi"))
    handle.emit(TokenEvent("a"))  # before anyone listens
    wakes = []
    handle.on_events(lambda: wakes.append(1))
    assert wakes == [1]  # what was waiting already
    handle.emit(TokenEvent("b"))
    assert wakes == [1, 1]
    assert handle.take() == ([TokenEvent("a"), TokenEvent("b")], False)
    assert handle.take() == ([], False)
    done = DoneEvent("ab", RequestStats())
    handle.emit(done)
    handle.finish()
    assert handle.take() == ([done], True) and len(wakes) == 4
