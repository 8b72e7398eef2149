"""Session caches persisted to disk: a new process restores a chat's KV instead of
recomputing it, with the same greedy reply; damaged caches cost time, not answers."""

from __future__ import annotations

import json
import sqlite3

import pytest

from core.cli.main import main
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ChatMessage, DoneEvent, GenerationRequest, SamplingParams
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from core.paths import kv_cache_db_path
from kvcache.store import DiskStore
from tests.core.engine.helpers import counted, folder_budget_for

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def turn(capsys, model, data, session, text, *extra) -> dict:
    code = main(
        [
            "chat",
            "--model",
            str(model),
            "--data-dir",
            str(data),
            "--temp",
            "0",
            "--max-tokens",
            "16",
            "--json",
            "--kv-tokens",
            "4096",
            "--session",
            session,
            *extra,
            text,
        ]
    )
    assert code == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_second_process_restores_the_session(capsys, tiny_model, tmp_path):
    first = turn(capsys, tiny_model, tmp_path, "trip", "Plan a day in Lyon, please.")
    # a new process's engine
    second = turn(capsys, tiny_model, tmp_path, "trip", "And the evening?")
    assert second["restored_tokens"] >= first["prompt_tokens"] + first["completion_tokens"] - 64
    assert second["restored_tokens"] >= first["prompt_tokens"] + first["completion_tokens"] - 1
    assert (
        second["computed_tokens"]
        == second["prompt_tokens"] - second["restored_tokens"] - second["cached_tokens"]
    )
    # the same two turns with no disk cache and no RAM cache give the same reply
    other = tmp_path / "plain"
    turn(capsys, tiny_model, other, "trip", "Plan a day in Lyon, please.", "--no-cache")
    plain = turn(capsys, tiny_model, other, "trip", "And the evening?", "--no-cache")
    assert plain["restored_tokens"] == 0 and plain["reply"] == second["reply"]


def chat_two_turns(engine, session):
    history = [ChatMessage("user", "first question here")]
    d1 = list(
        engine.stream(GenerationRequest(messages=tuple(history), sampling=GREEDY, session=session))
    )[-1]
    history += [ChatMessage("assistant", d1.text), ChatMessage("user", "second one")]
    d2 = list(
        engine.stream(GenerationRequest(messages=tuple(history), sampling=GREEDY, session=session))
    )[-1]
    assert isinstance(d1, DoneEvent) and isinstance(d2, DoneEvent)
    return d1, d2, history


@pytest.mark.parametrize("kind", ["llama", "sliding", "recurrent"])
def test_restore_is_exact_for_every_kind(kind, tmp_path, monkeypatch):
    """The restored K/V are the saved bytes; the reply after the restart prefills the
    prompt's tail in another split than the first process did (different computations),
    so the two replies are compared token by token."""
    from tests.core.engine.token_log import TokenLog

    spec = TinyModelSpec(kind=kind, num_layers=2 if kind == "llama" else 4, sliding_window=16)
    path = write_tiny_model(tmp_path / kind, spec)
    log = TokenLog(monkeypatch)
    writer = Engine(tmp_path / "data", str(path), config=EngineConfig(pool_tokens=4096)).start()
    writer.wait_ready(60)
    d1, d2, history = chat_two_turns(writer, "s")
    writer.flush_disk_cache()
    writer.shutdown()
    reader = Engine(
        tmp_path / "data", str(path), config=EngineConfig(pool_tokens=4096)
    ).start()  # "after a restart"
    reader.wait_ready(60)
    try:
        request = GenerationRequest(messages=tuple(history), sampling=GREEDY, session="s")
        again = list(reader.stream(request))[-1]
        first_process, restarted = log.started()[1:]
        assert restarted == first_process
        assert again.text == d2.text
        assert (
            again.stats.restored_tokens >= d1.stats.prompt_tokens + d1.stats.completion_tokens - 1
        )
    finally:
        reader.shutdown()


@pytest.mark.parametrize("kind", ["sliding", "recurrent"])
def test_a_store_of_the_first_snapshot_format_restores_exactly(kind, tmp_path, monkeypatch):
    """A store written before snapshots went through mlx-lm's ``state`` (issue 44.6: each
    cache's attributes by name, the frozen old encoder) is read after the upgrade: the
    reply after the restart is token for token the first process's."""
    from kvcache import persist
    from kvcache.serialize import snapshot_to_bytes, unpack_arrays
    from tests.core.engine.token_log import TokenLog
    from tests.kvcache.old_snapshot_format import old_snapshot_to_bytes

    path = write_tiny_model(
        tmp_path / kind, TinyModelSpec(kind=kind, num_layers=4, sliding_window=16)
    )
    log = TokenLog(monkeypatch)
    monkeypatch.setattr(persist, "snapshot_to_bytes", old_snapshot_to_bytes)
    writer = Engine(tmp_path / "data", str(path), config=EngineConfig(pool_tokens=4096)).start()
    writer.wait_ready(60)
    d1, d2, history = chat_two_turns(writer, "s")
    writer.flush_disk_cache()
    writer.shutdown()
    monkeypatch.setattr(persist, "snapshot_to_bytes", snapshot_to_bytes)  # the upgrade
    db = sqlite3.connect(kv_cache_db_path(tmp_path / "data"))
    blobs = [b for (b,) in db.execute("SELECT snapshot FROM page_data WHERE snapshot NOT NULL")]
    db.close()
    assert blobs and all("format" not in unpack_arrays(b)[0] for b in blobs)
    reader = Engine(tmp_path / "data", str(path), config=EngineConfig(pool_tokens=4096)).start()
    reader.wait_ready(60)
    try:
        request = GenerationRequest(messages=tuple(history), sampling=GREEDY, session="s")
        again = list(reader.stream(request))[-1]
        first_process, restarted = log.started()[1:]
        assert restarted == first_process and again.text == d2.text
        assert (
            again.stats.restored_tokens >= d1.stats.prompt_tokens + d1.stats.completion_tokens - 1
        )
    finally:
        reader.shutdown()


def test_damaged_page_is_recomputed_not_trusted(capsys, tiny_model, tmp_path):
    first = turn(capsys, tiny_model, tmp_path, "s", "Hello there, tell me a story.")
    db = sqlite3.connect(kv_cache_db_path(tmp_path))
    rows = db.execute("SELECT key, kv FROM page_data").fetchall()
    assert rows
    for key, kv in rows:  # flip bytes in every page's K/V
        damaged = bytearray(kv)
        damaged[len(damaged) // 2] ^= 0xFF
        db.execute("UPDATE page_data SET kv = ? WHERE key = ?", (bytes(damaged), key))
    db.commit()
    db.close()
    second = turn(capsys, tiny_model, tmp_path, "s", "Go on.")
    assert second["restored_tokens"] == 0
    assert second["computed_tokens"] == second["prompt_tokens"]
    # the same computation (every prompt whole, from scratch, in both data folders): the same reply
    fresh = tmp_path / "fresh"
    turn(capsys, tiny_model, fresh, "s", "Hello there, tell me a story.", "--no-cache")
    assert turn(capsys, tiny_model, fresh, "s", "Go on.", "--no-cache")["reply"] == second["reply"]
    assert first["completion_tokens"] == 16


def test_cache_commands(capsys, tiny_model, tmp_path):
    turn(capsys, tiny_model, tmp_path, "a", "first session")
    turn(capsys, tiny_model, tmp_path, "b", "second session")
    assert main(["cache", "stats", "--json", "--data-dir", str(tmp_path)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["sessions"] == 2 and stats["pages"] >= 2 and stats["bytes"] > 0
    assert stats["bytes_written"] == stats["bytes"] and stats["pages_written"] == stats["pages"]
    assert main(["cache", "verify", "--json", "--data-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["bad_pages"] == 0
    assert main(["cache", "clear", "--session", "a", "--data-dir", str(tmp_path)]) == 0
    assert "session a" in capsys.readouterr().out
    assert main(["cache", "stats", "--json", "--data-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["sessions"] == 1
    assert main(["cache", "clear", "--data-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    # the chat history is untouched by clearing the cache
    from core import paths
    from core.chats.store import ChatStore

    with ChatStore(paths.chats_db_path(tmp_path)) as store:
        assert len(store.messages(store.get_session("a").id)) == 2


def test_newer_cache_schema_runs_without_disk_cache(capsys, tiny_model, tmp_path):
    turn(capsys, tiny_model, tmp_path, "s", "hello")
    db = sqlite3.connect(kv_cache_db_path(tmp_path))
    db.execute("PRAGMA user_version = 42")
    db.close()
    second = turn(capsys, tiny_model, tmp_path, "s", "again")  # still answers, from scratch
    assert second["restored_tokens"] == 0 and second["completion_tokens"] == 16
    assert main(["cache", "stats", "--data-dir", str(tmp_path)]) == 2
    assert "newer" in capsys.readouterr().err


@pytest.mark.real_model
def test_default_model_two_processes_match_one(data_root_with_default, tmp_path):
    """Two `radixchat chat --session s --json` processes vs one process with the RAM cache."""
    import os
    import subprocess
    import sys

    def run(root, *args, stdin=None):
        env = dict(os.environ, RADIXCHAT_HOME=str(root))
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "app.launcher",
                "chat",
                "--temp",
                "0",
                "--json",
                "--max-tokens",
                "24",
                "--kv-tokens",
                "4096",
                "--session",
                "s",
                *args,
            ],
            capture_output=True,
            text=True,
            env=env,
            input=stdin,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-800:]
        return [json.loads(line) for line in result.stdout.strip().splitlines()]

    q1, q2 = "Name a famous French painter.", "What is he best known for?"
    (first,) = run(data_root_with_default, q1)
    (second,) = run(data_root_with_default, q2)
    assert second["restored_tokens"] >= first["prompt_tokens"] + first["completion_tokens"] - 64
    single_root = tmp_path / "single"
    single_root.mkdir()
    for name in os.listdir(data_root_with_default / "models"):
        (single_root / "models").mkdir(exist_ok=True)
        (single_root / "models" / name).symlink_to(data_root_with_default / "models" / name)
    one, two = run(single_root, stdin=f"{q1}\n{q2}\n")
    assert two["cached_tokens"] > 0 and two["restored_tokens"] == 0
    # restored bytes against the RAM cache's: the same K/V, the same greedy reply
    assert (first["reply"], second["reply"]) == (one["reply"], two["reply"])


def test_forget_session_removes_its_disk_cache_and_keeps_shared_pages(tmp_path, tiny_model):
    engine = Engine(tmp_path, str(tiny_model)).start()
    try:
        engine.wait_ready(timeout=120)
        system = ChatMessage("system", "You are a helpful assistant who answers briefly. " * 4)
        for session in ("keep", "drop"):
            request = GenerationRequest(
                messages=(system, ChatMessage("user", f"hello from {session}")),
                sampling=SamplingParams(temperature=0.0, max_tokens=8),
                session=session,
            )
            list(engine.stream(request))
        engine.flush_disk_cache()
        engine.forget_session("drop")
        engine.flush_disk_cache()
    finally:
        engine.shutdown()
    with DiskStore(kv_cache_db_path(tmp_path)) as store:
        assert [info.name for info in store.sessions()] == ["keep"]
        assert store.verify().clean


@pytest.mark.parametrize("kind", ["llama", "sliding"])
def test_damaged_page_mid_chain_restores_the_pages_before_it(kind, tmp_path):
    spec = TinyModelSpec(kind=kind, num_layers=2, sliding_window=16)
    path = write_tiny_model(tmp_path / kind, spec)
    history = [ChatMessage("user", "a long first question about trains and boats " * 6)]
    writer = Engine(tmp_path / "data", str(path), config=EngineConfig(pool_tokens=4096)).start()
    writer.wait_ready(60)
    try:
        d1 = list(
            writer.stream(GenerationRequest(messages=tuple(history), sampling=GREEDY, session="s"))
        )[-1]
        writer.flush_disk_cache()
    finally:
        writer.shutdown()
    with DiskStore(kv_cache_db_path(tmp_path / "data")) as store:
        [info] = store.sessions()
        with store.read_session("s", info.fingerprint) as reader:
            chain = reader.chain
    assert len(chain) >= 4 and all(len(page.tokens) == 64 for page in chain[:3])
    # flip a byte in the third page
    with sqlite3.connect(kv_cache_db_path(tmp_path / "data")) as db:
        kv = bytearray(
            db.execute("SELECT kv FROM page_data WHERE key = ?", [chain[2].key]).fetchone()[0]
        )
        kv[len(kv) // 3] ^= 0x55
        db.execute("UPDATE page_data SET kv = ? WHERE key = ?", [bytes(kv), chain[2].key])
    history += [ChatMessage("assistant", d1.text), ChatMessage("user", "and planes?")]
    request = GenerationRequest(messages=tuple(history), sampling=GREEDY, session="s")
    reader = Engine(tmp_path / "data", str(path), config=EngineConfig(pool_tokens=4096)).start()
    reader.wait_ready(60)
    try:
        restored = list(reader.stream(request))[-1]
        plain = list(
            reader.stream(
                GenerationRequest(messages=tuple(history), sampling=GREEDY, use_cache=False)
            )
        )[-1]
    finally:
        reader.shutdown()
    # the two good pages before the bad one come back (a hybrid model needs a snapshot
    # there, and this chain has its first at the prompt's end: nothing); the rest is recomputed
    assert restored.stats.restored_tokens == (128 if kind == "llama" else 0)
    assert restored.text == plain.text
    with DiskStore(kv_cache_db_path(tmp_path / "data")) as store:
        assert store.verify().clean  # the bad page was dropped when it was found


def test_a_save_that_evicts_another_session_does_not_resend_this_one(
    tmp_path, tiny_model, monkeypatch
):
    import kvcache.persist as persist

    def ask(engine, session, *texts):
        messages = tuple(ChatMessage("user", t) for t in texts)
        request = GenerationRequest(messages=messages, sampling=GREEDY, session=session)
        assert isinstance(list(engine.stream(request))[-1], DoneEvent)
        engine.flush_disk_cache()

    long_text = "tell me about the history of the old town and its harbour " * 6
    other_text = "which mountains can one walk up in a day from the city centre " * 6
    first = Engine(tmp_path, str(tiny_model)).start()
    try:
        first.wait_ready(timeout=120)
        ask(first, "old", long_text)
    finally:
        first.shutdown()
    with DiskStore(kv_cache_db_path(tmp_path)) as store:
        one_session = counted(store.stats())
    serialized = []
    original = persist.kv_to_bytes
    monkeypatch.setattr(
        persist, "kv_to_bytes", lambda arrays: serialized.append(1) or original(arrays)
    )
    engine = Engine(
        tmp_path,
        str(tiny_model),
        config=EngineConfig(disk_budget_bytes=folder_budget_for(int(one_session * 1.6))),
    ).start()
    try:
        engine.wait_ready(timeout=120)
        ask(engine, "new", other_text)  # its save evicts "old" (no page in common)
        first_save = len(serialized)
        with DiskStore(kv_cache_db_path(tmp_path)) as store:
            assert [s.name for s in store.sessions()] == ["new"]
        serialized.clear()
        ask(engine, "new", other_text, "and a follow-up")
    finally:
        engine.shutdown()
    assert first_save >= 4
    assert 0 < len(serialized) <= 2  # only the pages past what is stored already
    with DiskStore(kv_cache_db_path(tmp_path)) as store:
        assert store.verify().clean


def test_a_session_the_pool_can_never_hold_is_not_read(tmp_path, tiny_model):
    request = GenerationRequest(
        messages=(ChatMessage("user", "a long question about trains " * 10),),
        sampling=GREEDY,
        session="big",
    )
    first = Engine(tmp_path, str(tiny_model)).start()
    try:
        first.wait_ready(timeout=120)
        expected = list(first.stream(request))[-1]
        first.flush_disk_cache()
    finally:
        first.shutdown()
    assert expected.stats.prompt_tokens > 256
    small = Engine(
        tmp_path, str(tiny_model), config=EngineConfig(pool_tokens=256)
    ).start()  # the smallest pool
    try:
        small.wait_ready(timeout=120)
        done = list(small.stream(request))[-1]
    finally:
        small.shutdown()
    assert done.text == expected.text and done.stats.restored_tokens == 0
    with DiskStore(kv_cache_db_path(tmp_path)) as store:
        assert store.stats().loads == 0  # its pages were never read


def test_a_restore_does_not_wait_for_the_write_lock(tmp_path, tiny_model):
    """Marking restored pages used takes SQLite's write lock; the engine thread leaves
    that to the writer thread, so a restore goes ahead while another process writes."""
    history = (ChatMessage("user", "what is the weather like on the coast in spring?"),)
    first = Engine(tmp_path, str(tiny_model)).start()
    try:
        first.wait_ready(timeout=120)
        reply = list(
            first.stream(GenerationRequest(messages=history, sampling=GREEDY, session="s"))
        )[-1]
        first.flush_disk_cache()
    finally:
        first.shutdown()
    follow_up = history + (
        ChatMessage("assistant", reply.text),
        ChatMessage("user", "and in autumn?"),
    )
    holder = sqlite3.connect(kv_cache_db_path(tmp_path), isolation_level=None)
    engine = Engine(tmp_path, str(tiny_model)).start()
    try:
        engine.wait_ready(timeout=120)
        holder.execute("BEGIN IMMEDIATE")  # another process writing, past the busy timeout
        done = list(
            engine.stream(GenerationRequest(messages=follow_up, sampling=GREEDY, session="s"))
        )[-1]
        holder.execute("ROLLBACK")
        engine.flush_disk_cache()
    finally:
        engine.shutdown()
        holder.close()
    assert done.stats.restored_tokens > 0
    assert done.text == reply_without_cache(tiny_model, tmp_path, follow_up)


def reply_without_cache(model, root, messages) -> str:
    engine = Engine(root / "plain", str(model), config=EngineConfig(use_cache=False)).start()
    try:
        engine.wait_ready(timeout=120)
        return list(
            engine.stream(GenerationRequest(messages=messages, sampling=GREEDY, use_cache=False))
        )[-1].text
    finally:
        engine.shutdown()
