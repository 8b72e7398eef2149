"""SIGKILL at random moments while a chat saves its cache: nothing is lost or wrong after.

A child process chats as ``radixchat chat`` does (an :class:`Engine` plus the
:class:`ChatStore`; each finished turn goes to the chat store with ``add_turn`` while the
engine's writer thread saves the session's KV to ``kvcache.db``), turn after turn, as
fast as it can, across sessions ``chat-0``, ``chat-1``... of ``MAX_TURNS`` turns each,
continuing where the previous child was killed. The parent kills it with SIGKILL, then
checks the data folder the crash left behind. Children are forked by a small server
process that has imported everything once (that import alone takes a second or more),
so ``TRIALS`` kills fit in well under a minute.

Kill moments (``random.Random(SEED)``; the delays are reproducible, what they hit depends
on the machine's speed): even trials wait a uniform delay after the engine is ready; odd
trials wait for the k-th cache save to begin (k uniform in 1..6) and kill within a few
milliseconds of it, so that a good share land mid-save. The child marks, in an
``O_APPEND`` log that survives the kill, when each save begins and ends, when a write
transaction opens and closes, and when each ``add_turn`` begins and returns: a kill
"landed mid-save" when the log ends inside a save. Those marks, and a WAL checkpoint
every 8 database pages (instead of SQLite's 1000, which this little traffic would never
reach) so that kills land in checkpoints too, are patched into ``DiskStore`` in the
child only.

What "passes" means after each kill:
- the cache database: SQLite's own recovery (WAL replay on open) runs first, then
  ``PRAGMA integrity_check`` is "ok", and ``DiskStore.verify()`` is clean: no bad page,
  no session cut back or dropped, no orphan. A SIGKILL cannot tear a committed SQLite
  transaction (the OS keeps the WAL), so anything verify has to repair here would be a
  bug in the store's transactions, and fails the test; a second verify must be clean too
  (repairs converge);
- the chat history: every turn whose ``add_turn`` returned is there, in order, as a
  user + assistant pair; at most the one turn in flight may be there as well, never half;
- the next request, in a fresh engine on that folder (restoring what the disk holds),
  gives the same greedy reply as a ``use_cache=False`` request for the same messages.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core import paths
from core.chats.store import ChatStore
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ChatMessage, DoneEvent, GenerationRequest, SamplingParams
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.store import DiskStore

SEED = 20240611
# 12 kills in `make test` (each a fork, a kill and a fresh engine's check: ~3 s); a longer
# hunt for a rare interleaving: RADIXCHAT_KILL_TRIALS=200 pytest -k sigkill_during_saves
TRIALS = int(os.environ.get("RADIXCHAT_KILL_TRIALS", "12"))
MAX_TURNS = 5
MAX_TOKENS = 16
SPEC = TinyModelSpec(
    hidden_size=128,
    num_layers=4,
    num_heads=4,
    num_kv_heads=4,
    intermediate_size=256,
    max_position_embeddings=1024,
)

# A fork server: imports once (transformers alone takes a second), then forks one chatting
# child per trial, so 20+ trials fit in well under a minute. Nothing MLX or SQLite is
# opened before the fork: each child loads the model and opens both databases itself.
SERVER = r"""
import contextlib, os, sys, time
from pathlib import Path

from core import paths
from core.chats.store import ChatStore
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ChatMessage, DoneEvent, GenerationRequest, SamplingParams
from kvcache.store import DiskStore

model, root = sys.argv[1], Path(sys.argv[2])
max_turns, max_tokens = int(sys.argv[3]), int(sys.argv[4])


def chat_forever(log_path):
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def mark(*parts):
        os.write(log, (" ".join(map(str, parts)) + "\n").encode())

    original = DiskStore.save_session

    def save_session(self, session, fingerprint, pages, *more, **options):  # (the namespace...)
        mark("B", session, time.monotonic())
        result = original(self, session, fingerprint, pages, *more, **options)
        mark("E", session, time.monotonic())
        return result

    def transaction(self):  # "W": inside a write transaction, "C": out of it
        mark("W")
        with original_transaction(self):
            yield
        mark("C")

    def init(self, *args, **kw):  # checkpoint often, so kills land in checkpoints too
        original_init(self, *args, **kw)
        self.db.execute("PRAGMA wal_autocheckpoint = 8")

    original_transaction, original_init = DiskStore._transaction, DiskStore.__init__
    DiskStore.save_session, DiskStore.__init__ = save_session, init
    DiskStore._transaction = contextlib.contextmanager(transaction)
    store = ChatStore(paths.chats_db_path(root))
    engine = Engine(root, model, config=EngineConfig(pool_tokens=4096)).start()
    engine.wait_ready()
    print("ready", flush=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    n = 0
    while True:  # as `radixchat chat` does: history from the store, one request, add_turn
        session = store.get_or_create_session(f"chat-{n}")
        history = store.messages(session.id)
        turn = len(history) // 2
        if turn >= max_turns:
            n += 1
            continue
        question = f"Question {turn} of chat {n}: what comes after {turn * 7 % 13}?"
        messages = [ChatMessage(m.role, m.content) for m in history]
        messages.append(ChatMessage("user", question))
        done = list(engine.stream(GenerationRequest(messages=tuple(messages), sampling=greedy,
                                                    session=session.name)))[-1]
        assert isinstance(done, DoneEvent), done
        mark("A", session.name, turn)
        store.add_turn(session.id, question, done.text)
        mark("T", session.name, turn)


for line in sys.stdin:  # "fork LOG": start a child, report its pid, then how it ended
    pid = os.fork()
    if pid == 0:
        try:
            chat_forever(line.split(maxsplit=1)[1].strip())
        finally:
            os._exit(1)
    print("pid", pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print("exit", os.waitstatus_to_exitcode(status), flush=True)
"""


def question(chat: int, turn: int) -> str:  # the child's, mirrored
    return f"Question {turn} of chat {chat}: what comes after {turn * 7 % 13}?"


class ForkServer:
    """The parent's handle on the fork server (its stdout carries pids and "ready")."""

    def __init__(self, model: Path, root: Path, errors: Path):
        self._errors = open(errors, "w")
        self.errors_path = errors
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(model), str(root), str(MAX_TURNS), str(MAX_TOKENS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
            cwd=Path(__file__).parents[3],
        )
        self.child: int | None = None  # a forked child not yet reported dead
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for text in self.proc.stdout:
            self._lines.put(text.strip())

    def line(self, timeout: float = 60.0) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"the fork server went quiet: {self.errors_path.read_text()[-2000:]}"
            ) from None

    def close(self) -> None:
        if self.child is not None:  # a check failed before the kill: leave nothing running
            os.kill(self.child, signal.SIGKILL)
        self.proc.stdin.close()
        self.proc.wait(30)
        self._reader.join(5)
        self.proc.stdout.close()
        self._errors.close()


def run_child(server: ForkServer, log: Path, rng: random.Random, trial: int) -> None:
    """Fork a chatting child and SIGKILL it at this trial's moment."""
    server.proc.stdin.write(f"fork {log}\n")
    server.proc.stdin.flush()
    kind, pid = server.line().split()
    assert kind == "pid"
    server.child = int(pid)
    assert server.line() == "ready"
    if trial % 2 == 0:
        time.sleep(rng.uniform(0.0, 0.8))
    else:
        saves, delay = rng.randint(1, 6), rng.uniform(0.0, 0.004)
        deadline = time.monotonic() + 20
        while _lines(log).count("B") < saves and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(delay)
    os.kill(server.child, signal.SIGKILL)
    assert server.line() == f"exit {-signal.SIGKILL}", server.errors_path.read_text()[-2000:]
    server.child = None


def _lines(log: Path) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def check_cache_db(root: Path) -> None:
    with DiskStore(paths.kv_cache_db_path(root)) as store:  # opening replays the WAL
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        first = store.verify()
        second = store.verify()
        assert first.clean, first
        assert second.clean, second
        assert store.stats().orphan_pages == 0


def check_history(root: Path, completed: dict[str, int], in_flight: str | None) -> None:
    """Every completed turn is there, in order, whole; updates ``completed`` with the
    turn in flight if it made it."""
    with ChatStore(paths.chats_db_path(root)) as store:
        for session in store.list_sessions():
            chat = int(session.name.split("-")[1])
            messages = store.messages(session.id)
            assert len(messages) % 2 == 0, f"{session.name}: a half-written turn"
            turns = len(messages) // 2
            for i in range(turns):
                user, reply = messages[2 * i], messages[2 * i + 1]
                assert (user.role, user.content, reply.role) == (
                    "user",
                    question(chat, i),
                    "assistant",
                )
            done = completed.get(session.name, 0)
            assert turns >= done, f"{session.name}: {done} turns completed, {turns} stored"
            assert turns <= done + (session.name == in_flight), (
                f"{session.name}: turns out of nowhere"
            )
            completed[session.name] = turns


def check_next_answer(model: Path, root: Path) -> int:
    """A fresh engine answers the next turn of the latest chat as a cache-free request
    does; returns the tokens it restored from disk."""
    with ChatStore(paths.chats_db_path(root)) as store:
        session = max(store.list_sessions(), key=lambda s: int(s.name.split("-")[1]))
        history = [ChatMessage(m.role, m.content) for m in store.messages(session.id)]
    messages = tuple(history + [ChatMessage("user", "And one more thing?")])
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    engine = Engine(root, str(model), config=EngineConfig(pool_tokens=4096)).start()
    try:
        engine.wait_ready(60)
        cached = list(
            engine.stream(
                GenerationRequest(messages=messages, sampling=greedy, session=session.name)
            )
        )[-1]
        plain = list(
            engine.stream(GenerationRequest(messages=messages, sampling=greedy, use_cache=False))
        )[-1]
    finally:
        engine.shutdown()  # flushes its own save first: the next child finds the store idle
    assert isinstance(cached, DoneEvent) and isinstance(plain, DoneEvent)
    assert cached.text == plain.text, (
        f"{session.name}: reply after the crash differs from a recompute"
    )
    return cached.stats.restored_tokens


def check_trial(
    model: Path, root: Path, log: Path, completed: dict[str, int]
) -> tuple[bool, bool, bool, int]:
    """The checks after one kill; returns (killed mid-save, killed inside the save's write
    transaction, killed during add_turn, tokens the next request restored)."""
    marks = log.read_text().splitlines() if log.exists() else []
    saves = [m for m in marks if m[0] in "BEWC"]
    turns = [m for m in marks if m[0] in "AT"]
    in_flight = turns[-1].split()[1] if turns and turns[-1][0] == "A" else None
    for mark in turns:  # turns whose add_turn returned
        kind, name, turn = mark.split()
        if kind == "T":
            completed[name] = max(completed.get(name, 0), int(turn) + 1)
    check_cache_db(root)
    check_history(root, completed, in_flight)
    begun = max((i for i, m in enumerate(saves) if m[0] in "BE"), default=None)
    mid_save = begun is not None and saves[begun][0] == "B"
    in_commit = mid_save and saves[-1][0] == "W"  # in the save's write transaction
    return mid_save, in_commit, in_flight is not None, check_next_answer(model, root)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork and SIGKILL")
def test_sigkill_during_saves_loses_nothing(tmp_path):
    model = write_tiny_model(tmp_path / "tiny", SPEC)
    root = tmp_path / "data"
    root.mkdir()
    rng = random.Random(SEED)
    completed: dict[str, int] = {}
    mid_saves = in_commits = mid_turns = restored_trials = 0
    started = time.monotonic()
    server = ForkServer(model, root, tmp_path / "children.err")
    try:
        for trial in range(TRIALS):
            log = tmp_path / f"marks-{trial}.log"
            run_child(server, log, rng, trial)
            mid_save, in_commit, mid_turn, restored = check_trial(model, root, log, completed)
            mid_saves += mid_save
            in_commits += in_commit
            mid_turns += mid_turn
            restored_trials += restored > 0
    finally:
        server.close()
    print(
        f"\n{TRIALS} kills in {time.monotonic() - started:.1f} s: {mid_saves} mid-save "
        f"({in_commits} inside its write transaction), {mid_turns} during add_turn; "
        f"{sum(completed.values())} turns kept in {len(completed)} chats; the next request "
        f"restored from disk in {restored_trials} trials"
    )
    assert sum(completed.values()) >= TRIALS  # the children got real work done
    assert mid_saves >= 1  # the odd trials aim at saves: at least one must land inside one
    assert restored_trials >= TRIALS // 2
