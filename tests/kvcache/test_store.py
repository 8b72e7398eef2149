"""kvcache.store: round trips, sharing, damage, budget, clearing, a model, crashes."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcache.store import (
    SCHEMA_VERSION,
    DiskStore,
    DiskStoreError,
    PageData,
    chain_keys,
    page_key,
    save_bytes_for,
)

REPO = Path(__file__).resolve().parents[2]
FP, OTHER_FP = "model-a", "model-b"


def kv_for(fingerprint: str, chain: list[tuple[int, ...]], size: int = 256) -> bytes:
    """Deterministic K/V bytes for the last page of ``chain`` (as real K/V is a
    function of the model and the whole prefix)."""
    seed = hashlib.sha256(repr((fingerprint, chain)).encode()).digest()
    return random.Random(seed).randbytes(size)


def make_pages(
    chain: list[tuple[int, ...]], fingerprint: str = FP, size: int = 256
) -> list[PageData]:
    pages = []
    for i, tokens in enumerate(chain):
        kv = kv_for(fingerprint, chain[: i + 1], size)
        pages.append(PageData(tokens, kv, kv[:16] if sum(tokens) % 2 else None))
    return pages


def page(start: int, n: int = 4) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def same(loaded, pages) -> bool:
    return [(p.tokens, p.kv, p.snapshot) for p in loaded] == [
        (p.tokens, p.kv, p.snapshot) for p in pages
    ]


@pytest.fixture
def store(tmp_path):
    with DiskStore(tmp_path / "store.db") as store:
        yield store


def raw(path: Path) -> closing[sqlite3.Connection]:
    """A second connection, to damage the database behind the store's back."""
    return closing(sqlite3.connect(str(path), isolation_level=None))


# -- round trips and sharing --


def test_round_trip_is_byte_exact(store):
    pages = make_pages([page(0), page(4), page(8, 2)], size=5000)
    pages.append(PageData((7,), b"", b""))  # empty K/V and snapshot: kept apart from None
    result = store.save_session("chat", FP, pages)
    keys = chain_keys(FP, [p.tokens for p in pages])
    assert (result.pages, result.tokens, result.pages_written, result.head) == (4, 11, 4, keys[-1])
    loaded = store.load_session("chat", FP)
    assert same(loaded, pages)
    assert [p.key for p in loaded] == keys
    assert store.missing_keys(keys + ["f" * 64]) == {"f" * 64}
    [info] = store.sessions()
    assert (info.name, info.fingerprint, info.tokens, info.pages) == ("chat", FP, 11, 4)
    stats = store.stats()
    assert (stats.sessions, stats.pages, stats.loads, stats.restored_tokens) == (1, 4, 1, 11)


def test_a_writer_thread_can_use_the_store(store):
    pages = make_pages([page(0), page(4)])
    with ThreadPoolExecutor(1) as writer:  # opened here, used there: one thread at a time
        writer.submit(store.save_session, "chat", FP, pages).result()
    assert same(store.load_session("chat", FP), pages)


def test_keys_chain_through_parents():
    first = page_key(FP, None, (1, 2))
    assert page_key(FP, first, (3,)) != page_key(FP, None, (3,))
    assert page_key(OTHER_FP, None, (1, 2)) != first
    assert page_key(FP, None, (1, 2)) == first
    with pytest.raises(ValueError):
        page_key(FP, None, ())
    with pytest.raises(ValueError):
        page_key(FP, None, (2**31,))


def test_resave_writes_nothing_and_placeholders_skip_serializing(store):
    pages = make_pages([page(0), page(4)])
    store.save_session("chat", FP, pages)
    assert store.save_session("chat", FP, pages).pages_written == 0
    longer = make_pages([page(0), page(4), page(8)])
    keys = chain_keys(FP, [p.tokens for p in longer])
    missing = store.missing_keys(keys)
    assert missing == {keys[2]}
    given_pages = [p if k in missing else PageData(p.tokens, None) for p, k in zip(longer, keys)]
    result = store.save_session("chat", FP, given_pages)
    assert (result.pages_written, result.tokens) == (1, 12)
    assert same(store.load_session("chat", FP), longer)
    # A placeholder for a page the store no longer has: the prefix before it is saved.
    result = store.save_session("other", FP, [longer[0], PageData(page(99), None), longer[2]])
    assert (result.pages, result.tokens) == (1, 4)
    assert store.verify().clean


def test_shared_prefix_is_stored_once(store):
    system = page(1000, 64)
    for i in range(100):
        store.save_session(f"chat-{i}", FP, make_pages([system, (i, i + 1, i + 2)]))
    stats = store.stats()
    assert (stats.sessions, stats.pages, stats.orphan_pages) == (100, 101, 0)
    assert same(store.load_session("chat-42", FP), make_pages([system, (42, 43, 44)]))


def test_extension_orphans_the_old_tail_and_removes_it(store):
    old = make_pages([page(0), page(4, 2)])
    store.save_session("chat", FP, old)
    old_tail = chain_keys(FP, [p.tokens for p in old])[-1]
    store.save_session("keeper", FP, old)  # references the old tail too
    new = make_pages([page(0), page(4), page(8, 3)])
    store.save_session("chat", FP, new)
    assert store.missing_keys([old_tail]) == set()  # still referenced by "keeper"
    store.clear("keeper")
    assert store.missing_keys([old_tail]) == {old_tail}
    assert store.stats().pages == 3 and store.stats().orphan_pages == 0
    assert same(store.load_session("chat", FP), new)
    assert store.verify().clean


def test_empty_save_clears_the_session(store):
    store.save_session("chat", FP, make_pages([page(0)]))
    result = store.save_session("chat", FP, [])
    assert (result.head, result.pages) == (None, 0)
    assert store.sessions() == [] and store.stats().pages == 0


def test_load_reads_only_that_chain(store):
    for i in range(20):
        store.save_session(f"chat-{i}", FP, make_pages([page(0), page(100 * i), page(100 * i + 4)]))
    statements: list[str] = []
    store.db.conn.set_trace_callback(statements.append)
    assert len(store.load_session("chat-7", FP)) == 3
    store.db.conn.set_trace_callback(None)
    queries = [
        s for s in statements if s.lstrip().upper().startswith(("SELECT", "UPDATE", "INSERT"))
    ]
    assert queries
    for sql in queries:
        plan = " ".join(row[3] for row in store.db.execute("EXPLAIN QUERY PLAN " + sql))
        assert "SCAN" not in plan, (sql, plan)


# -- damage: never a wrong answer, never a crash --


def test_flipped_bytes_in_the_file_drop_the_page_and_keep_the_prefix(tmp_path):
    path = tmp_path / "store.db"
    pages = make_pages([page(0), page(4), page(8), page(12)], size=20000)
    with DiskStore(path) as store:
        store.save_session("chat", FP, pages)
    data = bytearray(path.read_bytes())  # closed: the log is folded into the file
    offset = data.find(pages[2].kv[5000:5064])
    assert offset > 0
    data[offset + 7] ^= 0xFF
    path.write_bytes(bytes(data))
    with DiskStore(path) as store:
        assert same(store.load_session("chat", FP), pages[:2])
        assert store.stats().pages == 2 and store.stats().dropped_pages == 1
        [info] = store.sessions()
        assert (info.tokens, info.pages) == (8, 2)  # cut back to the good prefix
        assert store.verify().clean


def test_verify_reports_and_drops_bad_rows(store):
    pages = make_pages([page(0), page(4), page(8)])
    store.save_session("chat", FP, pages)
    store.save_session("fork", FP, pages[:1] + make_pages([page(0), page(50)])[1:])
    keys = chain_keys(FP, [p.tokens for p in pages])
    with raw(store.path) as conn:
        conn.execute("UPDATE page_data SET kv = ? WHERE key = ?", [b"x" + pages[1].kv[1:], keys[1]])
    report = store.verify()
    assert (report.pages_checked, report.bad_pages, report.sessions_truncated) == (4, 1, 1)
    assert report.orphans_removed == 1  # the good page after the bad one
    assert same(store.load_session("chat", FP), pages[:1])
    assert len(store.load_session("fork", FP)) == 2
    assert store.verify().clean


@pytest.mark.parametrize(
    "column, value",
    [
        ("tokens", (9).to_bytes(4, "little") * 4),  # tokens that do not hash to the key
        ("parent", "0" * 64),  # a broken parent link
        ("fingerprint", OTHER_FP),  # a page of another model in the chain
    ],
)
def test_a_page_that_does_not_match_its_key_is_never_returned(store, column, value):
    pages = make_pages([page(0), page(4), page(8)])
    store.save_session("chat", FP, pages)
    keys = chain_keys(FP, [p.tokens for p in pages])
    with raw(store.path) as conn:
        conn.execute(f"UPDATE pages SET {column} = ? WHERE key = ?", [value, keys[1]])
    # The first page cannot be reached past the bad one: nothing comes back, nothing wrong.
    assert store.load_session("chat", FP) == []
    assert store.sessions() == [] and store.stats().pages == 0
    assert store.verify().clean


def test_another_models_session_is_never_returned(store):
    store.save_session("chat", FP, make_pages([page(0), page(4)]))
    assert store.load_session("chat", OTHER_FP) == []
    assert len(store.load_session("chat", FP)) == 2  # still there for its own model
    with raw(store.path) as conn:  # a session row that claims another model
        conn.execute("UPDATE sessions SET fingerprint = ?", [OTHER_FP])
    assert store.load_session("chat", OTHER_FP) == []
    assert store.verify().clean  # the session was dropped by that load
    assert store.sessions() == []


def test_truncated_file_is_an_error_or_loads_nothing_wrong(tmp_path):
    path = tmp_path / "store.db"
    pages = make_pages([page(4 * i) for i in range(40)], size=30000)
    with DiskStore(path) as store:
        store.save_session("chat", FP, pages)
    whole = path.read_bytes()
    for cut in (100, len(whole) // 2, len(whole) - 4096):
        path.write_bytes(whole[:cut])
        try:
            with DiskStore(path) as store:
                loaded = store.load_session("chat", FP)
                assert same(loaded, pages[: len(loaded)])
        except DiskStoreError as exc:
            assert str(path) in str(exc)


def test_not_a_database_names_the_path(tmp_path):
    path = tmp_path / "store.db"
    path.write_bytes(b"this is not sqlite " * 500)
    with pytest.raises(DiskStoreError, match="not a readable KV cache") as caught:
        DiskStore(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "store.db"
    DiskStore(path).close()
    with raw(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(DiskStoreError, match="newer RadixChat"):
        DiskStore(path)


def test_another_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "store.db"
    with raw(path) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    with pytest.raises(DiskStoreError, match="not a RadixChat KV cache"):
        DiskStore(path)


def test_locked_database_is_an_error(tmp_path):
    path = tmp_path / "store.db"
    DiskStore(path).close()
    with raw(path) as holder:
        holder.execute("BEGIN IMMEDIATE")
        with DiskStore(path, timeout=0.05) as store:
            with pytest.raises(DiskStoreError, match="locked"):
                store.save_session("chat", FP, make_pages([page(0)]))
            assert store.missing_keys(["f" * 64]) == {"f" * 64}  # reading is not blocked (WAL)


def test_disk_full_writes_nothing(store):
    first = make_pages([page(0), page(4)], size=1000)
    store.save_session("chat", FP, first)
    pages_now = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages_now + 2}")  # a disk with 128 KiB left
    with pytest.raises(DiskStoreError, match="disk is full"):
        store.save_session("chat", FP, first + make_pages([page(8), page(12)], size=200_000)[1:])
    assert same(store.load_session("chat", FP), first)
    assert store.stats().pages == 2
    assert store.verify().clean


# -- budget and clearing --


def test_budget_drops_least_recently_used_sessions_first(tmp_path):
    system = page(1000, 8)
    chains = {name: [system, page(100 * i)] for i, name in enumerate("abcd")}
    with DiskStore(tmp_path / "store.db", budget_bytes=10**9) as store:
        for name in "abc":
            store.save_session(name, FP, make_pages(chains[name], size=10_000))
        per_session = store.stats().bytes // 3  # about one tail page each
        store.budget_bytes = store.stats().bytes + per_session // 2
        store.load_session("a", FP)  # "a" is now more recent than "b"
        result = store.save_session("d", FP, make_pages(chains["d"], size=10_000))
        assert result.evicted_sessions == ("b",)
        assert {s.name for s in store.sessions()} == {"a", "c", "d"}
        assert store.load_session("b", FP) == []
        assert same(store.load_session("a", FP), make_pages(chains["a"], size=10_000))
        assert store.stats().evicted_sessions == 1 and store.stats().orphan_pages == 0
        store.budget_bytes = 1
        assert store.enforce_budget() > 0
        assert store.stats().pages == 0 and store.sessions() == []


def _on_disk(path: Path) -> int:
    return sum(
        side.stat().st_size for side in (path, path.with_name(path.name + "-wal")) if side.exists()
    )


def test_a_store_with_save_bytes_keeps_its_files_within_the_budget(tmp_path):
    # The soak's finding: pages counted within the budget while the database (free pages
    # of writes evicted after they landed) and its log took twice it on disk.
    path, budget = tmp_path / "store.db", 24 * 2**20
    rng = random.Random(7)
    with DiskStore(path, budget_bytes=budget, save_bytes=save_bytes_for(budget)) as store:
        assert store.save_bytes == 4 * 65536 * 6  # a sixteenth of the budget
        system = [page(10_000 + 4 * i) for i in range(6)]
        for turn in range(60):
            tail = [page(100_000 * turn + 4 * i) for i in range(rng.randint(1, 24))]
            chain = system + tail
            size = rng.choice([150_000, 260_000, 700_000])
            pages = make_pages(system, size=200_000) + make_pages(chain, size=size)[len(system) :]
            result = store.save_session(f"chat{turn % 9}", FP, pages)
            assert _on_disk(path) <= budget, turn
            if sum(len(p.kv) for p in pages) < store.pages_limit() // 2:
                assert result.pages == len(pages)  # a chain of several writes, all of it kept
                assert same(store.load_session(f"chat{turn % 9}", FP), pages)
        stats = store.stats()
        assert stats.evicted_sessions > 0 and stats.prefixes == 0  # no write's scaffolding left
        assert stats.saves == 60
        assert store.verify().clean


def test_a_file_past_a_lowered_budget_is_rewritten_within_it(tmp_path):
    path = tmp_path / "store.db"
    with DiskStore(path, budget_bytes=10**9) as store:
        for i in range(12):
            store.save_session(f"s{i}", FP, make_pages([page(10 * i)], size=1_000_000))
    assert _on_disk(path) > 11 * 10**6
    budget = 4 * 2**20
    with DiskStore(path, budget_bytes=budget, save_bytes=save_bytes_for(budget)) as store:
        store.enforce_budget()
        assert _on_disk(path) <= budget
        assert 0 < len(store.sessions()) < 12


def test_clear_one_session_then_everything(tmp_path):
    path = tmp_path / "store.db"
    with DiskStore(path) as store:
        store.save_session("a", FP, make_pages([page(0), page(4)], size=100_000))
        store.save_session("b", FP, make_pages([page(0), page(8)], size=100_000))
        tail_bytes = store.stats().bytes // 3
        assert store.clear("a") == pytest.approx(tail_bytes, rel=0.01)
        assert store.load_session("a", FP) == [] and len(store.load_session("b", FP)) == 2
        assert store.clear("nobody") == 0
        before = store.stats().file_bytes
        assert store.clear() > 0
        stats = store.stats()
        assert (stats.sessions, stats.pages, stats.bytes) == (0, 0, 0)
        assert stats.file_bytes < before / 2


# -- a model: random saves, extensions, clears and loads --

SESSIONS = ("s0", "s1", "s2")
page_tokens = st.lists(st.integers(0, 2), min_size=1, max_size=3).map(tuple)
chains = st.lists(page_tokens, min_size=0, max_size=4)
operations = st.one_of(
    st.tuples(st.just("save"), st.sampled_from(SESSIONS), st.sampled_from((FP, OTHER_FP)), chains),
    st.tuples(st.just("extend"), st.sampled_from(SESSIONS), st.booleans(), chains),
    st.tuples(st.just("clear"), st.sampled_from(SESSIONS)),
    st.tuples(st.just("clear all")),
)


@settings(max_examples=50, deadline=None, database=None)
@given(st.lists(operations, max_size=12))
def test_store_behaves_like_a_dict_of_chains(ops):
    model: dict[str, tuple[str, list[tuple[int, ...]]]] = {}  # session -> (fingerprint, chain)
    with tempfile.TemporaryDirectory() as tmp, DiskStore(Path(tmp) / "store.db") as store:
        for op in ops:
            if op[0] == "save":
                _, name, fingerprint, chain = op
                store.save_session(name, fingerprint, make_pages(chain, fingerprint))
                if chain:
                    model[name] = (fingerprint, chain)
                else:
                    model.pop(name, None)
            elif op[0] == "extend":
                _, name, replace_tail, more = op
                fingerprint, chain = model.get(name, (FP, []))
                chain = (chain[:-1] if replace_tail else chain) + more
                store.save_session(name, fingerprint, make_pages(chain, fingerprint))
                if chain:
                    model[name] = (fingerprint, chain)
                else:
                    model.pop(name, None)
            elif op[0] == "clear":
                store.clear(op[1])
                model.pop(op[1], None)
            else:
                store.clear()
                model.clear()

            assert store.verify().clean
            assert {s.name for s in store.sessions()} == set(model)
            keys = {
                key
                for fingerprint, chain in model.values()
                for key in chain_keys(fingerprint, chain)
            }
            assert store.stats().pages == len(keys)  # shared pages once, no orphans
            for name in SESSIONS:
                fingerprint, chain = model.get(name, (FP, []))
                assert same(store.load_session(name, fingerprint), make_pages(chain, fingerprint))
                other = OTHER_FP if fingerprint == FP else FP
                assert store.load_session(name, other) == []


# -- crash safety: SIGKILL at random moments while saving --

CRASH_CHILD = r"""
import hashlib, sys
from pathlib import Path

from kvcache.store import DiskStore, PageData

def state(session, step):
    first = 1000 * session
    full = [tuple(range(first + 8 * j, first + 8 * j + 8)) for j in range(step % 4)]
    return full + [(90000 + step,) + tuple(range(step % 5))]

def pages(chain):  # K/V: a function of the prefix only, as a model's is
    out = []
    for j, tokens in enumerate(chain):
        kv = hashlib.sha256(repr(chain[: j + 1]).encode()).digest() * 256
        out.append(PageData(tokens, kv, kv[:64] if j % 2 else None))
    return out

if __name__ == "__main__":
    store = DiskStore(Path(sys.argv[1]), budget_bytes=int(sys.argv[2]))
    print("ready", flush=True)
    sys.stdin.readline()  # "go": one child saves at a time, so kills land at random moments
    step = 0
    while True:
        for session in range(3):
            store.save_session(f"s{session}", "fp", pages(state(session, step)))
            print(session, step, flush=True)
        step += 1
"""


def wait_for_log(log: Path, child: subprocess.Popen, until, deadline: float) -> None:
    """Poll a running child's ``log`` until ``until(text)`` holds (before ``deadline``)."""
    while not until(log.read_text()):
        assert child.poll() is None, log.read_text()
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_sigkill_during_saves_leaves_a_consistent_store(tmp_path):
    script = tmp_path / "crash_child.py"
    script.write_text(CRASH_CHILD)
    namespace: dict = {"__name__": "crash_child"}
    exec(compile(CRASH_CHILD, str(script), "exec"), namespace)  # state() and pages() here too
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(4)
    trials = []
    for trial in range(20):
        folder = tmp_path / f"trial-{trial}"
        folder.mkdir()
        budget = 10**9 if trial % 2 else 20_000  # odd trials: the budget evicts too
        log = open(folder / "log", "w")
        child = subprocess.Popen(
            [sys.executable, str(script), str(folder / "store.db"), str(budget)],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        trials.append((folder, budget, child))
    deadline = time.monotonic() + 60
    for folder, _, child in trials:
        wait_for_log(folder / "log", child, lambda text: text.startswith("ready"), deadline)
    for folder, _, child in trials:
        child.stdin.write(b"go\n")
        child.stdin.flush()
        # the kill lands after the child's own progress, not after a time a busy machine
        # stretches: `saves` saves logged (none in one trial of eight), then mid-way into
        # one of the next ones
        saves = 0 if rng.random() < 0.125 else rng.randint(1, 6)
        wait_for_log(
            folder / "log", child, lambda text, n=saves: len(text.splitlines()) > n, deadline + 60
        )
        time.sleep(rng.uniform(0.0, 0.01))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdin.close()

    trials_with_saves = 0
    for folder, budget, child in trials:
        assert child.returncode == -signal.SIGKILL, (folder / "log").read_text()
        committed: dict[int, int] = {}
        for line in (folder / "log").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) == 2:  # a line cut by the kill is ignored
                committed[int(parts[0])] = int(parts[1])
        trials_with_saves += bool(committed)
        with DiskStore(folder / "store.db", budget_bytes=budget) as store:
            assert store.verify().clean
            for session in range(3):
                last = committed.get(session)
                allowed = [[]] if last is None or budget < 10**9 else []
                if last is not None:
                    allowed.append(namespace["state"](session, last))
                allowed.append(namespace["state"](session, 0 if last is None else last + 1))
                loaded = store.load_session(f"s{session}", "fp")
                chain = [p.tokens for p in loaded]
                assert chain in allowed, (folder, session, last, chain)
                assert same(loaded, namespace["pages"](chain))
    assert trials_with_saves >= 10  # most children got to save before being killed


def test_session_lookup_by_name(store):
    store.save_session("one", FP, make_pages([(1, 2, 3), (4, 5)]))
    info = store.session("one")
    assert info is not None and info.tokens == 5 and info.pages == 2 and info.fingerprint == FP
    assert store.session("absent") is None
