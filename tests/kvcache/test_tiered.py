"""The cache's one front door (kvcache.tiered): both tiers of a loaded model behind
match / commit / release / forget_session / flush / give_way / close, the write-back wired
at construction, and a damaged or unopenable disk file handled inside."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from core.models.load.loader import load_model
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.builder import build_kv_cache
from kvcache.tiered import DiskSettings, TieredCache, forget_stored_session

FP = "f" * 64
PROMPT = list(range(40, 200))  # 160 tokens: more than two 64-token disk pages


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("tiered") / "m", TinyModelSpec())
    return load_model(str(path), tmp_path_factory.mktemp("data"))


def _build(tiny, pool_tokens=4096):
    return build_kv_cache(tiny.model, weight_bytes=0, page_size=16, pool_tokens=pool_tokens)


def _prefill(model, tokens):
    caches = make_prompt_cache(model)
    model(mx.array([tokens]), cache=caches)
    mx.eval([c.state for c in caches])
    return caches


def _settings(tmp_path, **changes):
    return DiskSettings(tmp_path / "kvcache.db", FP, 1 << 30, **{"min_write_tokens": 64, **changes})


def test_a_commit_reaches_both_tiers_and_a_new_cache_reads_it_back(tiny, tmp_path):
    cache = TieredCache(tiny.model, _build(tiny), _settings(tmp_path))
    prefix = cache.match(PROMPT, "ns", session="chat")
    assert prefix.length == 0 and prefix.restored == 0
    caches = _prefill(tiny.model, PROMPT)
    assert cache.commit(prefix, PROMPT, caches, session="chat") == len(PROMPT)
    cache.flush(30)
    assert cache.disk_stats().pages_written == 3  # 64 + 64 + 32
    cache.close()

    again = TieredCache(tiny.model, _build(tiny), _settings(tmp_path))  # a restart
    prefix = again.match(PROMPT + [7], "ns")
    assert prefix.length == len(PROMPT) and prefix.restored == len(PROMPT)
    got = again.make_caches(prefix)
    n = len(PROMPT)
    for ours, theirs in zip(got, caches):  # the bytes saved are the bytes restored
        assert mx.array_equal(ours.keys[..., :n, :], theirs.keys[..., :n, :])
        assert mx.array_equal(ours.values[..., :n, :], theirs.values[..., :n, :])
    again.release(prefix)
    other = again.match(PROMPT + [7], "another namespace")
    assert other.length == 0  # a namespace is served only what it wrote
    again.release(other)
    again.close()


def test_what_ram_evicts_goes_down_to_disk(tiny, tmp_path):
    """The write-back is wired at construction: a prefix evicted from a full pool is kept
    on disk even though it was never long enough to be written at its end."""
    cache = TieredCache(
        tiny.model, _build(tiny, pool_tokens=256), _settings(tmp_path, min_write_tokens=10**6)
    )
    first = cache.match(PROMPT, "")
    cache.commit(first, PROMPT, _prefill(tiny.model, PROMPT))
    other = [t + 1 for t in PROMPT]
    second = cache.match(other, "")
    cache.commit(second, other, _prefill(tiny.model, other))  # evicts the first
    cache.flush(30)
    assert cache.disk_stats().write_backs >= 1 and cache.disk_stats().pages_written >= 2
    assert cache.stats().evicted_tokens >= len(PROMPT)
    cache.close()


def test_forgetting_a_session_reaches_disk_with_or_without_a_tier(tiny, tmp_path):
    cache = TieredCache(tiny.model, _build(tiny), _settings(tmp_path))
    prefix = cache.match(PROMPT, "", session="chat")
    cache.commit(prefix, PROMPT, _prefill(tiny.model, PROMPT), session="chat")
    cache.flush(30)
    cache.close()
    forget_stored_session(tmp_path / "kvcache.db", "chat")  # no tier open (a model switch)
    again = TieredCache(tiny.model, _build(tiny), _settings(tmp_path, min_write_tokens=10**6))
    assert again.match(PROMPT, "", session="chat").restored == 0
    again.close()


def test_a_damaged_file_is_set_aside_and_a_new_one_started(tiny, tmp_path):
    (tmp_path / "kvcache.db").write_bytes(b"this is not a database" * 100)
    cache = TieredCache(tiny.model, _build(tiny), _settings(tmp_path))
    assert cache.disk is not None and cache.disk_error is None
    assert any(p.name.startswith("kvcache.db.") for p in tmp_path.iterdir())
    cache.close()


def test_a_disk_tier_that_cannot_open_leaves_ram_serving(tiny, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = TieredCache(tiny.model, _build(tiny), DiskSettings(blocker / "kvcache.db", FP, 1 << 30))
    assert cache.disk is None and cache.disk_error
    prefix = cache.match(PROMPT, "")
    assert cache.commit(prefix, PROMPT, _prefill(tiny.model, PROMPT)) == len(PROMPT)
    assert cache.match(PROMPT + [1], "").length == len(PROMPT)


def test_giving_way_deletes_the_files_and_starts_an_empty_tier(tiny, tmp_path):
    cache = TieredCache(tiny.model, _build(tiny), _settings(tmp_path))
    prefix = cache.match(PROMPT, "", session="chat")
    cache.commit(prefix, PROMPT, _prefill(tiny.model, PROMPT), session="chat")
    cache.flush(30)
    assert cache.give_way() > 0
    assert cache.disk is not None and cache.disk_stats().indexed_pages == 0
    cache.close()
