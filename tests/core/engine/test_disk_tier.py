"""The disk tier for every request: an unnamed prompt's prefix comes back from disk after a
restart, by its tokens alone, and the replies are the ones RAM only or no cache give."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import (
    ChatMessage,
    DoneEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.persist import read_pays
from kvcache.store import DiskStore
from tests.core.engine.helpers import counted, folder_budget_for, start_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
QUESTION = ChatMessage(
    "user", "Tell me about the trains, the boats and the old harbour walls. " * 5
)


def ask(engine: Engine, *messages: ChatMessage, **options) -> DoneEvent:
    done = list(engine.stream(GenerationRequest(messages=messages, sampling=GREEDY, **options)))[-1]
    assert isinstance(done, DoneEvent), done
    return done


@pytest.mark.parametrize("kind", ["llama", "sliding", "recurrent"])
def test_an_unnamed_prompt_comes_back_from_disk_after_a_restart(kind, tmp_path):
    spec = TinyModelSpec(kind=kind, num_layers=2 if kind == "llama" else 4, sliding_window=16)
    model = write_tiny_model(tmp_path / kind, spec)
    first = start_engine(tmp_path / "tiered", model, disk_min_tokens=64)
    try:
        d1 = ask(first, QUESTION)
        first.flush_disk_cache()
    finally:
        first.shutdown()
    follow_up = (
        QUESTION,
        ChatMessage("assistant", d1.text),
        ChatMessage("user", "And the canals?"),
    )
    second = start_engine(tmp_path / "tiered", model, disk_min_tokens=64)  # a restart: RAM is empty
    try:
        d2 = ask(second, *follow_up)
        plain = ask(second, *follow_up, use_cache=False)
        disk = second.stats().disk
    finally:
        second.shutdown()
    assert d2.stats.restored_tokens >= d1.stats.prompt_tokens - 1
    assert d2.stats.computed_tokens == d2.stats.prompt_tokens - d2.stats.restored_tokens
    assert disk.reads == 1 and disk.read_tokens == d2.stats.restored_tokens
    ram_only = start_engine(tmp_path / "ram", model, disk_cache=False)
    try:
        r1 = ask(ram_only, QUESTION)
        r2 = ask(ram_only, *follow_up)
    finally:
        ram_only.shutdown()
    assert (r1.text, r2.text) == (d1.text, d2.text) and d2.text == plain.text
    assert r2.stats.restored_tokens == 0 and r2.stats.cached_tokens > 0


def test_a_cancelled_request_is_written_as_a_finished_one_is(tmp_path, tiny_model):
    """A client that timed out and retries after a restart still reads its prompt back."""
    first = start_engine(tmp_path, tiny_model, disk_min_tokens=64)
    try:
        handle = first.submit(
            GenerationRequest(
                messages=(QUESTION,), sampling=SamplingParams(temperature=0.0, max_tokens=400)
            )
        )
        events = []
        for event in handle.events(timeout=60):
            events.append(event)
            if isinstance(event, TokenEvent):
                handle.cancel()
        assert events[-1].stats.finish_reason == "cancelled"
        first.flush_disk_cache()
    finally:
        first.shutdown()
    second = start_engine(tmp_path, tiny_model, disk_min_tokens=64)  # RAM is empty
    try:
        again = ask(second, QUESTION)
    finally:
        second.shutdown()
    assert again.stats.restored_tokens == again.stats.prompt_tokens - 1


def test_a_short_unnamed_request_is_not_written(tmp_path, tiny_model):
    engine = start_engine(tmp_path, tiny_model)  # the default: 256 tokens at least
    try:
        ask(engine, ChatMessage("user", "hi"))
        engine.flush_disk_cache()
        assert engine.stats().disk.pages_written == 0
    finally:
        engine.shutdown()
    with DiskStore(tmp_path / "kvcache.db") as store:
        assert store.stats().pages == 0


def test_a_damaged_unnamed_prefix_is_recomputed_not_used(tmp_path, tiny_model):
    engine = start_engine(tmp_path, tiny_model, disk_min_tokens=64)
    try:
        d1 = ask(engine, QUESTION)
        engine.flush_disk_cache()
    finally:
        engine.shutdown()
    with sqlite3.connect(tmp_path / "kvcache.db") as db:
        for key, kv in db.execute("SELECT key, kv FROM page_data").fetchall():
            damaged = bytearray(kv)
            damaged[len(damaged) // 2] ^= 0xFF
            db.execute("UPDATE page_data SET kv = ? WHERE key = ?", [bytes(damaged), key])
    follow_up = (QUESTION, ChatMessage("assistant", d1.text), ChatMessage("user", "More?"))
    engine = start_engine(tmp_path, tiny_model, disk_min_tokens=64)
    try:
        again = ask(engine, *follow_up)
        plain = ask(engine, *follow_up, use_cache=False)
    finally:
        engine.shutdown()
    assert again.stats.restored_tokens == 0 and again.text == plain.text
    with DiskStore(tmp_path / "kvcache.db") as store:
        assert store.verify().clean


def test_reading_is_chosen_only_when_it_beats_computing():
    assert read_pays(1000, 20_000, 0.0, 0.0)  # nothing measured yet: read (and measure)
    assert read_pays(1000, 20_000, 2e9, 500.0)  # 10 ms to read, 2 s to compute
    assert not read_pays(1000, 20_000, 1e6, 5000.0)  # 20 s to read, 0.2 s to compute


def test_a_stored_page_is_never_written_again(tmp_path, tiny_model):
    engine = start_engine(tmp_path, tiny_model, disk_min_tokens=64)
    try:
        d1 = ask(engine, QUESTION)
        engine.flush_disk_cache()
        first = engine.stats().disk
        ask(engine, QUESTION)  # the same prompt again: every page is on disk
        engine.flush_disk_cache()
        again = engine.stats().disk
    finally:
        engine.shutdown()
    assert first.pages_written > 0 and first.bytes_written > 0
    assert (again.pages_written, again.bytes_written) == (first.pages_written, first.bytes_written)
    assert again.pages_not_rewritten >= first.pages_written
    follow_up = (QUESTION, ChatMessage("assistant", d1.text), ChatMessage("user", "And then?"))
    # a restart: the index comes from disk
    engine = start_engine(tmp_path, tiny_model, disk_min_tokens=64)
    try:
        ask(engine, *follow_up)
        engine.flush_disk_cache()
        later = engine.stats().disk
    finally:
        engine.shutdown()
    with DiskStore(tmp_path / "kvcache.db") as store:
        stats = store.stats()
    assert later.pages_not_rewritten > 0  # the first turn's pages, known from the index
    assert stats.bytes_written == stats.bytes  # nothing evicted: every byte written once
    assert stats.pages_written == stats.pages == first.pages_written + later.pages_written


def test_what_ram_evicts_is_written_back_and_read_instead_of_recomputed(tmp_path, tiny_model):
    other = ChatMessage(
        "user", "Now something else entirely: the mountains, rivers and lakes. " * 5
    )
    # a pool that holds one of the two prompts; no end-of-request writes for unnamed
    # prompts: only the eviction writes them
    engine = Engine(
        tmp_path, str(tiny_model), config=EngineConfig(pool_tokens=448, disk_min_tokens=10**6)
    ).start()
    engine.wait_ready(60)
    try:
        a1 = ask(engine, QUESTION)
        engine.flush_disk_cache()
        assert engine.stats().disk.pages_written == 0  # nothing written at the request's end
        ask(engine, other)  # the pool holds one of the two: the first is evicted
        engine.flush_disk_cache()
        disk = engine.stats().disk
        assert disk.write_backs >= 1 and disk.pages_written > 0
        a2 = ask(engine, QUESTION)  # read back from disk, not recomputed
        assert a2.stats.restored_tokens >= a1.stats.prompt_tokens - 64
        assert a2.text == a1.text
    finally:
        engine.shutdown()


def test_after_a_model_switch_the_other_models_pages_go_first(tmp_path):
    first = write_tiny_model(tmp_path / "first", TinyModelSpec(seed=1))
    second = write_tiny_model(tmp_path / "second", TinyModelSpec(seed=2))
    engine = start_engine(tmp_path / "data", first, disk_min_tokens=64)
    try:
        ask(engine, QUESTION)
        engine.flush_disk_cache()
    finally:
        engine.shutdown()
    with DiskStore(tmp_path / "data" / "kvcache.db") as store:
        first_counted = counted(store.stats())
    # the same budget, filled by the second model: the first model's pages make room (the
    # folder's budget such that the KV cache's part of it holds what the first model stored)
    folder = folder_budget_for(first_counted + 1000)
    engine = start_engine(tmp_path / "data", second, disk_min_tokens=64, disk_budget_bytes=folder)
    try:
        done = ask(engine, QUESTION)
        engine.flush_disk_cache()
        fingerprint = engine.model_info.fingerprint
    finally:
        engine.shutdown()
    with DiskStore(tmp_path / "data" / "kvcache.db") as store:
        stats = store.stats()
        ours = sum(len(p.tokens) // 4 for p in store.index(fingerprint))
    assert counted(stats) <= first_counted + 1000 and stats.evicted_prefixes >= 1
    # ours whole (the last reply token is never fed back), theirs gone
    assert ours == done.stats.prompt_tokens + done.stats.completion_tokens - 1
    # and a budget lowered below what is stored is met when a model loads
    lowered = folder_budget_for(counted(stats) // 2)
    engine = start_engine(tmp_path / "data", second, disk_budget_bytes=lowered)
    try:
        engine.flush_disk_cache()
    finally:
        engine.shutdown()
    with DiskStore(tmp_path / "data" / "kvcache.db") as store:
        assert counted(store.stats()) <= counted(stats) // 2


def test_default_model_unnamed_prompt_after_a_restart(data_root_with_default):
    """The real default model: an unnamed prompt's prefix from disk after a restart gives the
    reply RAM only and no cache give."""
    system = ChatMessage("system", "You are a concise assistant for travellers. " * 12)
    question = ChatMessage("user", "Name three things to see in Paris.")
    config = EngineConfig(pool_tokens=4096, disk_min_tokens=64)
    first = Engine(data_root_with_default, "default", config=config).start()
    try:
        first.wait_ready(300)
        d1 = ask(first, system, question)
        first.flush_disk_cache()
        follow_up = (
            system,
            question,
            ChatMessage("assistant", d1.text),
            ChatMessage("user", "And in Lyon?"),
        )
        ram = ask(first, *follow_up)
    finally:
        first.shutdown()
    second = Engine(data_root_with_default, "default", config=config).start()
    try:
        second.wait_ready(300)
        restored = ask(second, *follow_up)
        plain = ask(second, *follow_up, use_cache=False)
    finally:
        second.shutdown()
    assert restored.stats.restored_tokens >= d1.stats.prompt_tokens - 1
    assert ram.stats.cached_tokens >= d1.stats.prompt_tokens - 1 and ram.stats.restored_tokens == 0
    assert restored.text == ram.text == plain.text


def test_a_reply_ends_before_its_pages_are_serialized_for_disk(tmp_path, tiny_model, monkeypatch):
    """The client gets the whole reply first; the engine makes the disk pages' bytes after
    (still before the next request or a flush), and they reach the disk."""
    import kvcache.persist as persist

    engine = start_engine(tmp_path / "data", tiny_model, disk_min_tokens=64)
    served_then = []
    real = persist.kv_to_bytes

    def serialize(arrays):
        served_then.append(engine.stats().requests_served)  # counted once its DoneEvent is out
        return real(arrays)

    monkeypatch.setattr(persist, "kv_to_bytes", serialize)
    try:
        done = ask(engine, QUESTION)
        engine.flush_disk_cache()
        disk = engine.stats().disk
    finally:
        engine.shutdown()
    assert served_then and set(served_then) == {1}
    assert disk.pages_written == len(served_then) > 0 and done.stats.prompt_tokens >= 64


def test_what_ram_evicts_is_read_back_while_the_writer_has_not_written_it(tmp_path, tiny_model):
    """Issue 42.6: the pressure bench restored nothing under load. The writer runs at nice
    19; a prefix RAM evicted was handed to it, and until it was written no restore could
    find it, so it was recomputed. Here the writer is held (as a starved one is) while RAM
    evicts the prefix and the prompt comes back: it is read from the pages on their way."""
    other = ChatMessage(
        "user", "Now something else entirely: the mountains, rivers and lakes. " * 5
    )
    engine = Engine(
        tmp_path, str(tiny_model), config=EngineConfig(pool_tokens=448, disk_min_tokens=10**6)
    ).start()
    engine.wait_ready(60)
    tier = engine._cache.disk
    release = threading.Event()
    do = tier._do
    tier._do = lambda job: (release.wait(60), do(job))
    try:
        a1 = ask(engine, QUESTION)
        ask(engine, other)  # the pool holds one of the two: the first is evicted, handed over
        assert engine.stats().disk.write_backs >= 1 and engine.stats().disk.pages_written == 0
        a2 = ask(engine, QUESTION)  # nothing written yet: read from memory, not recomputed
        assert a2.stats.restored_tokens >= a1.stats.prompt_tokens - 64
        assert a2.text == a1.text
        release.set()
        engine.flush_disk_cache()
        assert engine.stats().disk.pages_written > 0
    finally:
        release.set()
        engine.shutdown()
