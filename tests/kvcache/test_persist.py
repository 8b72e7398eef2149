"""DiskTier on tiny models: what a save writes (page ends, snapshots, only new
pages serialized), and that a restore into a fresh cache brings back the very K/V bytes
saved, as far as the prompt and (for a hybrid model) a snapshot allow."""

from __future__ import annotations

import os
import sys
import threading

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load

import kvcache.persist as persist
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.builder import build_kv_cache
from kvcache.persist import DISK_PAGE_TOKENS, DiskTier, _resume_point
from kvcache.prefix_cache import PrefixCache
from kvcache.store import ChainPage

FP = "a" * 64
SPECS = {
    "llama": TinyModelSpec(kind="llama", num_layers=2),
    "sliding": TinyModelSpec(kind="sliding", num_layers=4, sliding_window=16),
}


@pytest.fixture(scope="module", params=sorted(SPECS))
def model(request, tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp(request.param) / "m", SPECS[request.param])
    return load(str(path))[0]


def prefix_cache(model) -> PrefixCache:
    return PrefixCache(model, build_kv_cache(model, weight_bytes=0, page_size=8, pool_tokens=4096))


def computed(model, pc: PrefixCache, tokens: list[int], snapshot_at: tuple[int, ...] = ()):
    """mlx-lm caches holding ``tokens``, and snapshots taken after each of ``snapshot_at``
    (and the end)."""
    caches, done, snaps = make_prompt_cache(model), 0, []
    for end in sorted({*snapshot_at, len(tokens)}):
        model(mx.array(tokens[done:end])[None], cache=caches)
        mx.eval([c.state for c in caches])
        snap = pc.snapshot(caches, end)
        if snap is not None:
            snaps.append(snap)
        done = end
    return caches, snaps


@pytest.fixture
def tokens():
    return [(11 * i + 5) % 250 + 1 for i in range(150)]


@pytest.fixture
def db(tmp_path):
    return tmp_path / "kvcache.db"


def saved(model, db, tokens, snapshot_at=(), session="chat") -> DiskTier:
    return saved_with_caches(model, db, tokens, snapshot_at, session)[0]


def saved_with_caches(model, db, tokens, snapshot_at=(), session="chat") -> tuple[DiskTier, list]:
    """A DiskTier that saved ``tokens``, and the caches whose bytes it saved."""
    pc = prefix_cache(model)
    caches, snaps = computed(model, pc, tokens, snapshot_at)
    persister = DiskTier(db, pc, FP)
    persister.save(session, tokens, caches, snaps)
    persister.flush(timeout=30)
    return persister, caches


def greedy(model, caches, prompt_rest: list[int], steps: int = 6) -> list[int]:
    """``steps`` greedy tokens after feeding ``prompt_rest`` on top of ``caches``."""
    out, logits = [], model(mx.array(prompt_rest)[None], cache=caches)
    for _ in range(steps):
        out.append(mx.argmax(logits[0, -1]).item())
        logits = model(mx.array([[out[-1]]]), cache=caches)
    return out


def assert_continues_like_a_fresh_prefill(model, caches, prompt: list[int], cached: int) -> None:
    """Different computations: ``caches`` were filled by a prefill in pieces (and a restore),
    the reference by one prefill of the whole prompt, so OpenBLAS may sum in another order
    and the last bits may differ (issue 27). Within float32 rounding (DESIGN: 1e-4
    relative), and the same greedy tokens."""
    logits = model(mx.array(prompt[cached:])[None], cache=caches)[0, -1]
    fresh = make_prompt_cache(model)
    reference = model(mx.array(prompt)[None], cache=fresh)[0, -1]
    assert mx.allclose(logits, reference, rtol=1e-4, atol=1e-4).item(), (
        "logits after a restore drift past rounding"
    )
    # (the step above consumed prompt[cached:] on both: continue greedily from there)
    ours, theirs = [mx.argmax(logits).item()], [mx.argmax(reference).item()]
    ours += greedy(model, caches, ours[-1:], 5)
    theirs += greedy(model, fresh, theirs[-1:], 5)
    assert ours == theirs, "greedy tokens after a restore differ from a fresh prefill's"


def chain(persister: DiskTier, session="chat") -> list[ChainPage]:
    with persister.reader.read_session(session, FP, record=False) as reading:
        return list(reading.chain)


# ---------------------------------------------------------------- saving


def test_pages_end_every_page_size_at_snapshots_and_at_the_end(model, db, tokens):
    persister = saved(model, db, tokens, snapshot_at=(100,))
    try:
        pages = chain(persister)
        ends = [sum(len(p.tokens) for p in pages[: i + 1]) for i in range(len(pages))]
        hybrid = persister.prefix_cache.hybrid
        assert ends == (
            [DISK_PAGE_TOKENS, 100, 2 * DISK_PAGE_TOKENS, 150]
            if hybrid
            else [DISK_PAGE_TOKENS, 2 * DISK_PAGE_TOKENS, 150]
        )
        assert tuple(t for p in pages for t in p.tokens) == tuple(tokens)
        assert [p.has_snapshot for p in pages] == (
            [False, True, False, True] if hybrid else [False] * 3
        )
        info = persister.reader.session("chat")
        assert (info.fingerprint, info.tokens, info.pages) == (FP, 150, len(pages))
        assert persister.last_error is None
    finally:
        persister.close()


def test_a_hybrid_chain_without_a_snapshot_at_its_end_is_not_saved(model, db, tokens):
    pc = prefix_cache(model)
    caches, _ = computed(model, pc, tokens)
    persister = DiskTier(db, pc, FP)
    try:
        persister.save("chat", tokens, caches, [])  # no snapshots handed over
        persister.flush(timeout=30)
        assert (persister.reader.session("chat") is None) == pc.hybrid
    finally:
        persister.close()


def test_a_longer_turn_serializes_only_its_new_pages(model, db, tokens, monkeypatch):
    pc = prefix_cache(model)
    persister = DiskTier(db, pc, FP)
    try:
        caches, snaps = computed(model, pc, tokens[:130])
        persister.save("chat", tokens[:130], caches, snaps)
        persister.flush(timeout=30)
        serialized = []
        real = persist.kv_to_bytes
        monkeypatch.setattr(
            persist,
            "kv_to_bytes",
            lambda arrays: serialized.append(arrays[0][0].shape[1]) or real(arrays),
        )
        caches, snaps = computed(model, pc, tokens)
        persister.save("chat", tokens, caches, snaps)
        persister.flush(timeout=30)
        assert serialized == [150 - 2 * DISK_PAGE_TOKENS]  # pages 1 and 2 were on disk already
        assert persister.reader.session("chat").tokens == 150
    finally:
        persister.close()


def test_forget_removes_the_session(model, db, tokens):
    persister = saved(model, db, tokens)
    try:
        persister.forget("chat")
        persister.flush(timeout=30)
        assert persister.reader.session("chat") is None
    finally:
        persister.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads' priorities: Linux")
def test_the_writer_thread_runs_at_the_lowest_cpu_priority(model, db, tokens):
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    persister = saved(model, db, tokens)  # the writer has done a job
    try:
        writer = persister.writer_thread_id
        assert writer != threading.get_native_id()
        assert os.getpriority(os.PRIO_PROCESS, writer) == persist.WRITER_NICENESS == 19
        # the engine's thread (here the test's) keeps its own
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
    finally:
        persister.close()


# ---------------------------------------------------------------- restoring


def test_restore_brings_back_the_saved_bytes(model, db, tokens):
    writer, original = saved_with_caches(model, db, tokens, snapshot_at=(100,))
    writer.close()
    pc = prefix_cache(model)
    persister = DiskTier(db, pc, FP)
    try:
        prompt = tokens + [7, 8, 9]
        assert persister.restore(prompt, "chat") == 150
        prefix = pc.match(prompt)
        assert prefix.length == 150
        caches = pc.make_caches(prefix)
        for layer in [s.slot for s in pc.build.layout.paged]:
            # the same computation: the restored K/V against the very arrays that were saved
            got, want = caches[layer], original[layer]
            assert mx.array_equal(got.keys[..., :150, :], want.keys[..., :150, :]).item(), (
                "restored keys != saved"
            )
            assert mx.array_equal(got.values[..., :150, :], want.values[..., :150, :]).item(), (
                "restored values != saved"
            )
        assert_continues_like_a_fresh_prefill(model, caches, prompt, 150)
        pc.release(prefix)
        assert persister.restore(prompt, "chat") == 0  # RAM serves it now
    finally:
        persister.close()


def test_a_restore_past_what_ram_holds_is_taken_whole_without_a_gather(
    model, db, tokens, monkeypatch
):
    """RAM holds the prompt's first 40 tokens (another request shared them), the disk all
    150: the restore joins RAM's K/V and the disk's into one buffer per layer, which the
    request takes as its cache (no gather out of the pool); the pool gets the same bytes."""
    writer, original = saved_with_caches(model, db, tokens, snapshot_at=(40, 100))
    writer.close()
    pc = prefix_cache(model)
    # as the saved chain's first forward: the same bits
    head, snaps = computed(model, pc, tokens[:40])
    pc.commit(pc.match(tokens[:40]), tokens[:40], head, snaps)
    persister = DiskTier(db, pc, FP)
    gathers = []
    gather = pc.pool.gather
    monkeypatch.setattr(pc.pool, "gather", lambda *a: gathers.append(a) or gather(*a))
    try:
        prompt = tokens + [7, 8, 9]
        assert pc.cached_length(prompt) == 40
        assert persister.restore(prompt, None) == 110
        gathers.clear()  # RAM's 40 tokens were copied out once, into the joined buffers
        prefix = pc.match(prompt)
        assert prefix.length == 150
        caches = pc.make_caches(prefix)
        assert gathers == []
        # the same computation: RAM's 40 tokens came from one forward over tokens[:40] from an
        # empty cache, as the saved chain's first 40 did; the rest are the saved bytes
        for layer in [s.slot for s in pc.build.layout.paged]:
            assert mx.array_equal(
                caches[layer].keys[..., :150, :], original[layer].keys[..., :150, :]
            ).item()
            assert mx.array_equal(
                caches[layer].values[..., :150, :], original[layer].values[..., :150, :]
            ).item()
        assert_continues_like_a_fresh_prefill(model, caches, prompt, 150)
        pc.release(prefix)
        pc.flush_writes()
        pooled = pc.make_caches(pc.match(tokens + [0]))  # the hot entry is taken: from the pool now
        assert gathers
        for layer in [s.slot for s in pc.build.layout.paged]:  # the same bytes, through the pool
            assert mx.array_equal(
                pooled[layer].keys[..., :150, :], original[layer].keys[..., :150, :]
            ).item()
    finally:
        persister.close()


def test_restore_stops_where_the_prompt_leaves_the_chain(model, db, tokens):
    saved(model, db, tokens, snapshot_at=(100,)).close()
    pc = prefix_cache(model)
    persister = DiskTier(db, pc, FP)
    try:
        prompt = tokens[:120] + [0, 0, 0]  # leaves the chain inside its second page
        got = persister.restore(prompt, "chat")
        assert got == (100 if pc.hybrid else 120)  # a hybrid model resumes at a snapshot
        assert pc.cached_length(prompt) == got
    finally:
        persister.close()


def test_nothing_is_restored_for_another_model_or_an_unknown_session(model, db, tokens):
    saved(model, db, tokens, snapshot_at=(100,)).close()
    pc = prefix_cache(model)
    other = DiskTier(db, pc, "b" * 64)
    try:
        assert other.restore(tokens + [1], "chat") == 0
        assert other.restore(tokens + [1], "nobody") == 0
        assert pc.cached_length(tokens) == 0
    finally:
        other.close()


def test_resume_point():
    pages = [
        ChainPage("k1", (1, 2, 3, 4), False),
        ChainPage("k2", (5, 6, 7, 8), True),
        ChainPage("k3", (9, 10), True),
    ]
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert _resume_point(pages, prompt, limit=10, hybrid=False) == 10
    assert _resume_point(pages, prompt, limit=6, hybrid=False) == 6
    assert _resume_point(pages, [1, 2, 3, 4, 5, 6, 0], limit=6, hybrid=False) == 6  # part of page 2
    assert _resume_point(pages, [1, 2, 0], limit=2, hybrid=False) == 2
    assert _resume_point(pages, [0, 1], limit=1, hybrid=False) == 0
    assert _resume_point(pages, prompt, limit=10, hybrid=True) == 10  # page ends with snapshots
    assert _resume_point(pages, prompt, limit=9, hybrid=True) == 8
    # no snapshot before
    assert _resume_point(pages, [1, 2, 3, 4, 5, 6, 0], limit=6, hybrid=True) == 0


def test_a_save_is_serialized_later_as_the_caches_were_when_saved(model, db, tokens, monkeypatch):
    """save() takes the new pages' K/V without serializing them (the engine sends the reply
    first); what is written later is what the caches held at the save, even if the
    request's caches were updated in place since (a follow-up extending them)."""
    pc = prefix_cache(model)
    caches, snaps = computed(model, pc, tokens)
    full = [s.slot for s in pc.build.layout.paged]
    want = [
        (mx.array(caches[i].keys[..., :150, :]), mx.array(caches[i].values[..., :150, :]))
        for i in full
    ]
    serialized = []
    real = persist.kv_to_bytes
    monkeypatch.setattr(
        persist, "kv_to_bytes", lambda arrays: serialized.append(len(arrays)) or real(arrays)
    )
    persister = DiskTier(db, pc, FP)
    try:
        persister.save("chat", tokens, caches, snaps)
        assert serialized == []
        for i in full:  # written over in place, as a follow-up's prefill writes past a trim
            caches[i].keys[..., 40:150, :] = 0.0
            caches[i].values[..., 40:150, :] = 0.0
        persister.serialize_pending()
        assert len(serialized) == 3  # the pages ending at 64, 128 and 150
        persister.flush(timeout=30)
    finally:
        persister.close()
    fresh = prefix_cache(model)
    reader = DiskTier(db, fresh, FP)
    try:
        assert reader.restore(tokens + [7], "chat") == 150
        prefix = fresh.match(tokens + [7])
        restored = fresh.make_caches(prefix)
        for i, (keys, values) in zip(full, want):
            assert mx.array_equal(restored[i].keys[..., :150, :], keys).item()
            assert mx.array_equal(restored[i].values[..., :150, :], values).item()
        fresh.release(prefix)
    finally:
        reader.close()


def test_restore_serves_only_the_namespace_that_saved(model, db, tokens):
    pc = prefix_cache(model)
    caches, snaps = computed(model, pc, tokens, (100,))
    writer = DiskTier(db, pc, FP, min_write_tokens=1)
    writer.save("chat", tokens, caches, snaps, namespace="app")
    writer.save(None, tokens, caches, snaps, namespace="alice")  # a prefix, kept by its tokens
    writer.flush(timeout=30)
    writer.close()
    pc = prefix_cache(model)
    persister = DiskTier(db, pc, FP)  # a restart: the index is read from the file
    try:
        prompt = tokens + [7, 8, 9]
        for namespace in ("api", "bob", ""):  # by tokens, and by the same session's name
            assert persister.restore(prompt, "chat", namespace) == 0
            assert pc.cached_length(prompt, namespace) == 0
        assert persister.restore(prompt, None, "alice") == 150
        assert pc.cached_length(prompt, "alice") == 150 and pc.cached_length(prompt, "app") == 0
        assert persister.restore(prompt, "chat", "app") == 150
        assert (
            persister.reader.session("app/chat") is not None
            and persister.reader.session("chat") is None
        )
        persister.forget("chat", "app")
        persister.flush(timeout=30)
        assert persister.reader.session("app/chat") is None
    finally:
        persister.close()


# ---------------------------------------------------------------- a writer that falls behind


def held_writer(persister: DiskTier) -> threading.Event:
    """Hold ``persister``'s writer thread before its next job until the returned event is
    set (a writer starved of CPU, as at nice 19 on a busy machine)."""
    release = threading.Event()
    do = persister._do

    def held(job):
        release.wait(60)
        do(job)

    persister._do = held
    return release


def test_pages_on_their_way_to_disk_are_restored_before_the_writer_writes_them(model, db, tokens):
    """Issue 42.6: a prefix handed to a writer that has not written it yet was invisible to
    restores (only written pages were indexed), so it was recomputed: under load the
    pressure bench restored nothing. Now it is read back from memory, the very bytes."""
    pc = prefix_cache(model)
    caches, snaps = computed(model, pc, tokens, snapshot_at=(100,))
    persister = DiskTier(db, pc, FP)
    release = held_writer(persister)
    try:
        persister.save("chat", tokens, caches, snaps)
        persister.serialize_pending()  # handed to the writer, which has written nothing
        assert persister.stats().pages_written == 0
        prompt = tokens + [7, 8, 9]
        assert persister.restore(prompt, None) == 150
        prefix = pc.match(prompt)
        restored = pc.make_caches(prefix)
        for layer in [s.slot for s in pc.build.layout.paged]:
            for got, want in (
                (restored[layer].keys, caches[layer].keys),
                (restored[layer].values, caches[layer].values),
            ):
                assert mx.array_equal(got[..., :150, :], want[..., :150, :]).item()
        assert_continues_like_a_fresh_prefill(model, restored, prompt, 150)
        pc.release(prefix)
        release.set()
        persister.flush(timeout=30)
        assert persister.stats().pages_written == (4 if pc.hybrid else 3)  # hybrid: one ends at 100
    finally:
        release.set()
        persister.close()
    fresh = prefix_cache(model)
    reader = DiskTier(db, fresh, FP)  # and they are on disk now, read from there
    try:
        assert reader.restore(tokens + [7, 8, 9], None) == 150
    finally:
        reader.close()


def test_pages_whose_write_failed_are_not_found_any_more(model, db, tokens, monkeypatch):
    from kvcache.store import DiskStoreError

    pc = prefix_cache(model)
    caches, snaps = computed(model, pc, tokens, snapshot_at=(100,))
    persister = DiskTier(db, pc, FP)
    release = held_writer(persister)

    def fails(*args, **kwargs):
        raise DiskStoreError("locked by another process")

    monkeypatch.setattr(persister._writer, "save_session", fails)
    try:
        persister.save("chat", tokens, caches, snaps)
        persister.serialize_pending()
        release.set()
        persister.flush(timeout=30)
        assert persister.stats().write_errors == 1 and len(persister.index) == 0
        assert persister.restore(tokens + [7], None) == 0 and pc.cached_length(tokens) == 0
    finally:
        release.set()
        persister.close()
