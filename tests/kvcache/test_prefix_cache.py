"""PrefixCache on tiny models of each kind: logits from cached prefixes as from scratch,
page accounting, eviction under pool pressure, sessions.

A cached prefix and the prompt's rest against one prefill of the whole prompt are
different computations (OpenBLAS may sum another shape of product in another order), so
their logits are compared within DESIGN's float32 rounding (1e-4 relative) and their
greedy choice must be the same token (:func:`assert_as_from_scratch`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load

from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.builder import build_kv_cache
from kvcache.prefix_cache import PrefixCache

SPECS = {
    "llama": TinyModelSpec(kind="llama", num_layers=2),
    "sliding": TinyModelSpec(kind="sliding", num_layers=4, sliding_window=16),
    "recurrent": TinyModelSpec(kind="recurrent", num_layers=4),
}


@pytest.fixture(scope="module", params=sorted(SPECS))
def tiny(request, tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp(request.param) / "m", SPECS[request.param])
    model, _ = load(str(path))
    return request.param, model


def make_cache(model, pool_tokens=4096, page_size=8) -> PrefixCache:
    build = build_kv_cache(model, weight_bytes=0, page_size=page_size, pool_tokens=pool_tokens)
    return PrefixCache(model, build)


def run(model, tokens, caches):
    """Feed ``tokens`` (in two chunks) and return the last position's logits."""
    half = max(1, len(tokens) // 2)
    model(mx.array(tokens[:half])[None], cache=caches)
    logits = model(mx.array(tokens[half:])[None], cache=caches)[0, -1] if tokens[half:] else None
    mx.eval(logits, [c.state for c in caches])
    return logits


def serve(pc: PrefixCache, model, prompt, session=None, namespace=""):
    """One request through the cache: match, compute the rest, snapshot, commit."""
    prefix = pc.match(prompt, namespace)
    caches = pc.make_caches(prefix)
    logits = run(model, prompt[prefix.length :], caches)
    snaps = [s for s in [pc.snapshot(caches, len(prompt))] if s is not None]
    pc.commit(prefix, prompt, caches, snaps, session)
    return prefix.length, logits


def reference_logits(model, tokens):
    return run(model, tokens, make_prompt_cache(model))


def assert_as_from_scratch(logits, expected) -> None:
    """Different computations (a cached prefix and the rest against one whole prefill):
    within float32 rounding, and the same greedy next token."""
    scale = float(mx.abs(expected).max())
    assert float(mx.abs(logits - expected).max()) <= 1e-4 * scale, (
        "logits drift past float32 rounding"
    )
    assert mx.argmax(logits).item() == mx.argmax(expected).item(), (
        "another greedy token than from scratch"
    )


def check_pages(pc: PrefixCache):
    """Every used page is referenced once per tree slot in it, and nothing leaks."""
    pc.tree.check_invariants()
    pc.allocator.check_invariants()
    counts: dict[int, int] = {}
    for slot in pc.tree.all_values():
        counts[slot // pc.page_size] = counts.get(slot // pc.page_size, 0) + 1
    assert pc.allocator.used_pages == len(counts)
    for page, n in counts.items():
        assert pc.allocator.refcount(page) == n


def test_cached_prefix_gives_the_same_logits(tiny):
    kind, model = tiny
    pc = make_cache(model)
    turn1 = list(range(40, 90))  # longer than the sliding window (16)
    cached, _ = serve(pc, model, turn1)
    assert cached == 0
    turn2 = turn1 + list(range(100, 137))
    cached, logits = serve(pc, model, turn2)
    assert cached == len(turn1)  # snapshot at the end of turn 1 (hybrid) or any prefix
    assert_as_from_scratch(logits, reference_logits(model, turn2))
    check_pages(pc)


def test_gathered_caches_have_room_for_the_rest_of_the_prompt(tiny):
    kind, model = tiny
    pc = make_cache(model)
    turn1 = list(range(40, 90))
    serve(pc, model, turn1)
    pc._hot.clear()  # gather from the pool, not the last request's objects
    turn2 = turn1 + [20 + 7 * i % 200 for i in range(300)]  # 300 more: past one 256-token step
    prefix = pc.match(turn2)
    caches = pc.make_caches(prefix, room=len(turn2) - prefix.length)
    full = [caches[i] for i, _ in pc.paged]
    assert all(c.offset == prefix.length and c.keys.shape[2] >= len(turn2) for c in full)
    capacity = [c.keys.shape[2] for c in full]
    logits = run(model, turn2[prefix.length :], caches)
    assert [c.keys.shape[2] for c in full] == capacity  # filled in place, never regrown
    assert_as_from_scratch(logits, reference_logits(model, turn2))
    pc.release(prefix)
    check_pages(pc)


def test_partial_overlap_and_branching(tiny):
    kind, model = tiny
    pc = make_cache(model)
    base = list(range(10, 60))
    serve(pc, model, base + [1, 2, 3])
    cached, logits = serve(pc, model, base + [7, 8, 9, 10])
    if kind == "llama":
        assert cached == len(base)  # token-exact: the shared part, not a page multiple
    else:
        assert cached == 0  # no snapshot at the branch point
    assert_as_from_scratch(logits, reference_logits(model, base + [7, 8, 9, 10]))
    check_pages(pc)


def test_pool_pressure_evicts_and_stays_exact(tiny):
    kind, model = tiny
    pc = make_cache(model, pool_tokens=64, page_size=8)
    prompts = [
        [t] + [(7 * j + 11 * i) % 250 + 1 for j in range(30)] for i, t in enumerate(range(5, 15))
    ]
    for prompt in prompts:
        serve(pc, model, prompt)
        check_pages(pc)
    assert pc.stats().evicted_tokens > 0 and pc.stats().evicted_pages > 0
    last = prompts[-1] + [3, 4, 5]
    cached, logits = serve(pc, model, last)
    assert_as_from_scratch(logits, reference_logits(model, last))
    check_pages(pc)


def test_sessions_are_evicted_after_anonymous_prefixes():
    path = write_tiny_model(Path(tempfile.mkdtemp()) / "m", SPECS["llama"])
    model, _ = load(str(path))
    pc = make_cache(model, pool_tokens=96, page_size=8)
    session_prompt = [(3 * j) % 250 + 2 for j in range(40)]
    serve(pc, model, session_prompt, session="keep-me")
    for i in range(6):  # anonymous traffic that overflows the pool
        serve(pc, model, [i + 1] + [(5 * j + 13 * i) % 250 + 1 for j in range(40)])
        check_pages(pc)
    cached, _ = serve(pc, model, session_prompt + [1, 2])
    assert cached == len(session_prompt)
    assert pc.stats().sessions == 1
    pc.forget_session("keep-me")
    assert pc.stats().sessions == 0
    check_pages(pc)


def test_release_without_commit_frees_the_lock(tiny):
    kind, model = tiny
    pc = make_cache(model)
    serve(pc, model, list(range(20, 60)))
    prefix = pc.match(list(range(20, 60)) + [5])
    assert pc.tree.protected_size() > 0
    pc.release(prefix)
    pc.release(prefix)  # twice is harmless
    assert pc.tree.protected_size() == 0
    check_pages(pc)


def test_disabled_cache_matches_nothing(tiny):
    kind, model = tiny
    build = build_kv_cache(model, weight_bytes=0, page_size=8, pool_tokens=256, disable=True)
    pc = PrefixCache(model, build)
    assert not pc.enabled and "disabled" in build.disable_reason
    serve(pc, model, list(range(20, 40)))
    cached, _ = serve(pc, model, list(range(20, 45)))
    assert cached == 0 and pc.allocator.used_pages == 0


def test_build_result_describes_the_model(tiny):
    kind, model = tiny
    build = build_kv_cache(model, weight_bytes=0, page_size=8, pool_tokens=800)
    assert build.layout.is_hybrid_swa == (kind == "sliding")
    assert build.layout.is_hybrid_ssm == (kind == "recurrent")
    assert build.layout.sliding_window == (16 if kind == "sliding" else None)
    assert build.page_size == 8 and build.pool.num_pages * 8 == build.allocator.num_pages * 8 == 800
    assert not build.disable_radix_cache and build.tree.require_snapshots == (kind != "llama")


def test_restored_kv_serves_the_next_request_exactly(tiny):
    kind, model = tiny
    source = make_cache(model)
    history = list(range(40, 90))
    serve(source, model, history)
    # K/V and snapshot "from disk", with 30 spare positions
    caches = source._hot["", tuple(history)]
    layers_kv = [
        tuple(
            mx.concatenate([a[0, :, : len(history)], mx.zeros_like(a[0, :, :30])], axis=1)
            for a in (caches[i].keys, caches[i].values)
        )
        for i, _ in source.paged
    ]
    snapshot = source.snapshot(caches, len(history))
    pc = make_cache(model)
    assert pc.insert_restored(history, 0, layers_kv, snapshot) == len(history)
    assert bool(pc._pending_writes) == bool(pc.paged)  # the pool copy waits...
    prompt = history + [5, 6, 7]
    prefix = pc.match(prompt)
    assert prefix.length == len(history)
    restored = pc.make_caches(prefix, room=4)
    if pc.paged:  # the restored buffers themselves: nothing gathered from the pool
        assert restored[pc.paged[0][0]].keys.shape[2] == len(history) + 30
    logits = run(model, prompt[prefix.length :], restored)
    assert_as_from_scratch(logits, reference_logits(model, prompt))
    pc.commit(prefix, prompt, restored, [s for s in [pc.snapshot(restored, len(prompt))] if s])
    assert not pc._pending_writes  # ...until the commit allocates, after the prefill ran in place
    pc._hot.clear()
    longer = prompt + [9, 10, 11]
    again = pc.match(longer)  # and the pool holds the same K/V
    assert again.length == len(prompt)
    logits = run(model, longer[again.length :], pc.make_caches(again))
    assert_as_from_scratch(logits, reference_logits(model, longer))
    pc.release(again)
    check_pages(pc)


def test_a_failed_pool_write_gives_its_pages_back(tiny, monkeypatch):
    kind, model = tiny
    if kind != "llama":
        pytest.skip("hybrid models page only at snapshots; the path is the same")
    pc = make_cache(model)
    free = pc.allocator.free_pages
    prompt = list(range(1, 60))
    prefix = pc.match(prompt)
    caches = pc.make_caches(prefix)
    run(model, prompt, caches)

    def broken(*args):
        raise MemoryError("pool write")

    monkeypatch.setattr(pc.pool, "write", broken)
    with pytest.raises(MemoryError):
        pc.commit(prefix, prompt, caches)
    assert pc.allocator.free_pages == free
    pc.tree.check_invariants()


def test_namespaces_share_the_pool_never_a_prefix(tiny):
    kind, model = tiny
    pc = make_cache(model)
    system = list(range(30, 90))
    serve(pc, model, system + [1, 2], session="chat", namespace="alice")
    # Another namespace (and the default one) get nothing of it, not even the hot caches
    # the last request left behind; the session's name is alice's alone.
    cached, logits = serve(pc, model, system + [3, 4], session="chat", namespace="bob")
    assert cached == 0 and serve(pc, model, system + [5])[0] == 0
    assert_as_from_scratch(logits, reference_logits(model, system + [3, 4]))
    assert pc.stats().sessions == 2 and pc.stats().namespaces == 3
    # Inside a namespace the shared system prompt still serves every request.
    cached, logits = serve(pc, model, system + [6, 7], namespace="alice")
    assert cached == (len(system) if kind == "llama" else 0)  # hybrid: no snapshot at the branch
    assert serve(pc, model, system + [1, 2, 8], namespace="alice")[0] == len(system) + 2
    pc.forget_session("chat", "bob")
    assert pc.stats().sessions == 1
    check_pages(pc)


def test_a_write_back_names_the_evicted_prefix_namespace():
    path = write_tiny_model(Path(tempfile.mkdtemp()) / "m", SPECS["llama"])
    model, _ = load(str(path))
    pc = make_cache(model, pool_tokens=64, page_size=8)
    handed = []
    pc.write_back = lambda tokens, source, snapshots, namespace: handed.append(
        (tuple(tokens), namespace)
    )
    first = [(7 * j) % 250 + 1 for j in range(40)]
    serve(pc, model, first, namespace="alice")
    serve(pc, model, [(5 * j) % 250 + 3 for j in range(40)], namespace="bob")  # evicts alice's
    assert (tuple(first), "alice") in handed


def test_a_dropped_cache_lets_its_model_go_at_once(tiny):
    """The cache and its tree hold no cycle: once the engine drops a model's cache (a model
    switch), its model and pool are freed at once, not whenever the cyclic GC next runs
    (which kept every switched-from model's weights in memory)."""
    import gc
    import weakref

    kind, model = tiny
    pc = make_cache(model, pool_tokens=64, page_size=8)
    handed = []
    pc.write_back = lambda tokens, source, snapshots, namespace: handed.append(tokens)
    serve(pc, model, [(7 * j) % 250 + 1 for j in range(40)])
    serve(pc, model, [(5 * j) % 250 + 3 for j in range(40)])  # evicts: the hook still works
    assert handed
    gone = weakref.ref(pc)
    gc.disable()
    try:
        del pc
        assert gone() is None
    finally:
        gc.enable()
