"""kvcache.store: chains kept by their tokens alone (prefixes), for the disk tier."""

from __future__ import annotations

import sqlite3

import pytest

from kvcache.store import DiskStore, chain_keys
from tests.kvcache.test_store import FP, OTHER_FP, make_pages, page, same


@pytest.fixture
def store(tmp_path):
    with DiskStore(tmp_path / "kvcache.db") as store:
        yield store


def test_a_prefix_is_kept_without_a_session_and_read_by_its_keys(store):
    chain = [page(0), page(4), page(8, 3)]
    pages = make_pages(chain)
    result = store.save_prefix(FP, pages)
    assert result.session is None and result.pages == 3 and result.pages_written == 3
    stats = store.stats()
    assert (stats.sessions, stats.prefixes, stats.pages, stats.orphan_pages) == (0, 1, 3, 0)
    keys = chain_keys(FP, chain)
    with store.read_chain(FP, keys) as reader:
        assert [p.key for p in reader.chain] == keys
        assert same(list(reader.pages()), pages)
    with store.read_chain(FP, keys) as reader:  # the first pages can be skipped
        assert same(list(reader.pages(3, first=2)), pages[2:])
    indexed = {p.key: p for p in store.index(FP)}
    assert set(indexed) == set(keys) and store.index(OTHER_FP) == []
    assert [indexed[k].has_snapshot for k in keys] == [p.snapshot is not None for p in pages]
    assert indexed[keys[1]].parent == keys[0] and indexed[keys[0]].parent is None


def test_a_stored_page_is_never_written_again_and_writes_are_counted(store):
    chain = [page(0), page(4)]
    first = store.save_prefix(FP, make_pages(chain, size=1000))
    longer = store.save_prefix(FP, make_pages(chain + [page(8)], size=1000))
    again = store.save_session("chat", FP, make_pages(chain + [page(8)], size=1000))
    assert (first.pages_written, longer.pages_written, again.pages_written) == (2, 1, 0)
    assert again.bytes_written == 0
    stats = store.stats()
    assert stats.pages_written == 3 == stats.pages
    assert stats.bytes_written == first.bytes_written + longer.bytes_written == stats.bytes


def test_read_chain_stops_at_a_missing_or_foreign_page(store):
    chain = [page(0), page(4), page(8)]
    store.save_prefix(FP, make_pages(chain))
    keys = chain_keys(FP, chain)
    with store.read_chain(FP, keys[:1] + ["0" * 64] + keys[2:]) as reader:
        assert [p.key for p in reader.chain] == keys[:1] and reader.missing == {"0" * 64}
    with store.read_chain(OTHER_FP, keys) as reader:  # another model's pages: never
        assert reader.chain == []
    with store.read_chain(FP, [keys[1]]) as reader:  # not a first page: its parent must lead
        assert reader.chain == []


def test_budget_drops_other_prefixes_before_sessions(tmp_path):
    with DiskStore(tmp_path / "kvcache.db", budget_bytes=10**9) as store:
        store.save_session("chat", FP, make_pages([page(0), page(4)], size=10_000))
        store.save_prefix(FP, make_pages([page(100), page(104)], size=10_000))
        store.save_prefix(FP, make_pages([page(200), page(204)], size=10_000))
        store.budget_bytes = store.stats().bytes - 1
        store.enforce_budget()
        stats = store.stats()
        assert (stats.sessions, stats.prefixes, stats.evicted_prefixes) == (1, 1, 1)
        keys = {p.key for p in store.index(FP)}
        assert set(chain_keys(FP, [page(200), page(204)])) <= keys  # the newer prefix stays
        assert not set(chain_keys(FP, [page(100), page(104)])) & keys
        store.budget_bytes = 1
        store.enforce_budget()
        assert store.stats().pages == 0


def test_a_read_by_tokens_keeps_what_it_used_as_a_prefix(store):
    chain = [page(0), page(4), page(8)]
    store.save_prefix(FP, make_pages(chain))
    keys = chain_keys(FP, chain)
    with store.read_chain(FP, keys[:2]) as reader:
        list(reader.pages())
    store.record_reading(None, FP, reader.used, reader.suspects, head=(keys[1], 8))
    assert store.stats().prefixes == 2 and store.stats().loads == 1
    store.db.execute("DELETE FROM prefixes WHERE head = ?", [keys[2]])  # the long one goes...
    store.enforce_budget()
    assert {p.key for p in store.index(FP)} == set(keys[:2])  # ...what was read stays


def test_a_damaged_page_cuts_its_prefix_back(store, tmp_path):
    chain = [page(0), page(4), page(8)]
    store.save_prefix(FP, make_pages(chain))
    keys = chain_keys(FP, chain)
    with sqlite3.connect(tmp_path / "kvcache.db") as db:
        db.execute("UPDATE page_data SET kv = ? WHERE key = ?", [b"x" * 256, keys[1]])
    with store.read_chain(FP, keys) as reader:
        assert len(list(reader.pages())) == 1 and reader.suspects == {keys[1]}
    store.record_reading(None, FP, reader.used, reader.suspects)
    assert {p.key for p in store.index(FP)} == {keys[0]}
    assert store.stats().prefixes == 1 and store.verify().clean


def test_the_budget_drops_other_models_pages_first_then_least_recently_used(tmp_path):
    with DiskStore(tmp_path / "kvcache.db", budget_bytes=10**9) as store:
        store.save_session("ours-old", FP, make_pages([page(0), page(4)], size=10_000))
        store.save_prefix(FP, make_pages([page(100), page(104)], size=10_000))
        store.save_session("theirs", OTHER_FP, make_pages([page(0), page(4)], size=10_000))
        store.save_prefix(OTHER_FP, make_pages([page(300), page(304)], size=10_000))
        store.save_session("ours-new", FP, make_pages([page(200), page(204)], size=10_000))
        per_chain = store.stats().bytes // 5
        store.budget_bytes = store.stats().bytes - per_chain  # one chain must go
        store.enforce_budget(FP)
        assert store.index(OTHER_FP) and store.stats().prefixes == 1  # their prefix went
        store.budget_bytes -= per_chain
        store.enforce_budget(FP)  # then their session, though newer than ours
        assert store.index(OTHER_FP) == [] and {s.name for s in store.sessions()} == {
            "ours-old",
            "ours-new",
        }
        store.budget_bytes -= per_chain
        store.enforce_budget(FP)  # then our prefix, before our sessions
        assert store.stats().prefixes == 0 and len(store.sessions()) == 2
        store.budget_bytes -= per_chain
        store.enforce_budget(FP)  # then our least recently used session
        assert [s.name for s in store.sessions()] == ["ours-new"]
        assert store.stats().bytes <= store.budget_bytes and store.verify().clean
