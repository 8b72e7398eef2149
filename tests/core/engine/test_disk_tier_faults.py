"""The disk tier under faults: SIGKILL while unnamed prefixes are written, a full disk."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ChatMessage, DoneEvent, GenerationRequest, SamplingParams
from kvcache.store import DiskStore, DiskStoreError

REPO = Path(__file__).resolve().parents[3]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
CHILD = textwrap.dedent("""
    import sys
    from core.engine.config import EngineConfig
    from core.engine.engine import Engine
    from core.engine.types import ChatMessage, GenerationRequest, SamplingParams

    config = EngineConfig(pool_tokens=1024, disk_min_tokens=64)
    engine = Engine(sys.argv[1], sys.argv[2], config=config).start()
    engine.wait_ready(120)
    print("ready", flush=True)
    n = 0
    while True:  # unnamed long prompts, one after another, until killed
        text = f"Prompt {n}: " + "notes about rivers, bridges and old towns. " * 6
        request = GenerationRequest(messages=(ChatMessage("user", text),),
                                    sampling=SamplingParams(temperature=0.0, max_tokens=8))
        list(engine.stream(request))
        n += 1
""")


def prompt(n: int) -> tuple[ChatMessage, ...]:
    return (
        ChatMessage("user", f"Prompt {n}: " + "notes about rivers, bridges and old towns. " * 6),
    )


def test_sigkill_while_prefixes_are_written_leaves_a_clean_store(tmp_path, tiny_model):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for trial, delay in enumerate((0.3, 0.9, 1.7)):
        child = subprocess.Popen(
            [sys.executable, str(script), str(data), str(tiny_model)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        try:
            assert child.stdout.readline().strip() == b"ready"
            time.sleep(delay)  # prompts are being answered and written meanwhile
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            child.stdout.close()
        with sqlite3.connect(data / "kvcache.db") as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        with DiskStore(data / "kvcache.db") as store:
            assert store.verify().clean, trial
            written = store.stats().pages
    assert written > 0
    engine = Engine(
        data, str(tiny_model), config=EngineConfig(pool_tokens=1024, disk_min_tokens=64)
    ).start()
    try:
        engine.wait_ready(60)
        for n in (0, 1, 1000):  # written before a kill, maybe mid-write, never written
            request = GenerationRequest(messages=prompt(n), sampling=GREEDY)
            cached = list(engine.stream(request))[-1]
            plain = list(
                engine.stream(
                    GenerationRequest(messages=prompt(n), sampling=GREEDY, use_cache=False)
                )
            )[-1]
            assert isinstance(cached, DoneEvent) and cached.text == plain.text
        assert engine.stats().disk.reads >= 1  # what the killed children wrote came back
    finally:
        engine.shutdown()


@pytest.mark.parametrize("how", ["write fails", "reserve reached"])
def test_a_full_disk_stops_writes_and_serving_goes_on(
    how, tmp_path, tiny_model, monkeypatch, caplog
):
    def full(self, *args, **kwargs):
        raise DiskStoreError(self.wordings["full"].format(path=self.path))

    if how == "write fails":  # SQLite says the disk is full
        monkeypatch.setattr(DiskStore, "save_prefix", full)
    else:  # the store sees the disk down to its reserve and writes nothing
        monkeypatch.setattr(DiskStore, "disk_room", lambda self: 0)
    engine = Engine(
        tmp_path, str(tiny_model), config=EngineConfig(pool_tokens=4096, disk_min_tokens=64)
    ).start()
    try:
        engine.wait_ready(60)
        with caplog.at_level(logging.WARNING, logger="kvcache.persist"):
            for n in range(4):
                done = list(engine.stream(GenerationRequest(messages=prompt(n), sampling=GREEDY)))[
                    -1
                ]
                assert isinstance(done, DoneEvent) and done.stats.completion_tokens == 8
                engine.flush_disk_cache()
        disk = engine.stats().disk
    finally:
        engine.shutdown()
    assert disk.writes_stopped is not None and "full" in disk.writes_stopped
    # the rest not tried
    assert disk.write_errors == (how == "write fails") and disk.pages_written == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "kvcache.persist"]
    assert len(lines) == 1 and "writes stopped" in lines[0]
