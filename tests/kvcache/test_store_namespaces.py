"""kvcache.store and kvcache.disk_index with cache namespaces: the same tokens in two
namespaces are two chains that never meet; inside one, pages are stored once as before;
the pages of a store written before namespaces are namespace "" pages, which no other
namespace reaches."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from kvcache.disk_index import DiskIndex
from kvcache.store import DiskStore, chain_keys, namespace_root, page_key, session_row
from tests.kvcache.test_store import FP, make_pages, page, same

CHAIN = [page(0), page(4), page(8, 3)]
PROMPT = [t for tokens in CHAIN for t in tokens] + [99]


@pytest.fixture
def store(tmp_path):
    with DiskStore(tmp_path / "store.db") as store:
        yield store


def test_a_namespace_roots_its_chains_and_the_default_keeps_the_old_keys():
    assert namespace_root("") is None
    assert chain_keys(FP, CHAIN) == chain_keys(FP, CHAIN, "")  # the format before namespaces
    assert chain_keys(FP, CHAIN)[0] == page_key(FP, None, CHAIN[0])
    alice, bob = chain_keys(FP, CHAIN, "alice"), chain_keys(FP, CHAIN, "bob")
    assert alice[0] == page_key(FP, namespace_root("alice"), CHAIN[0])
    assert not set(alice) & set(bob) and not set(alice) & set(chain_keys(FP, CHAIN))
    assert (
        namespace_root("alice") != namespace_root("bob") and len(namespace_root("alice")) == 3 + 64
    )
    assert session_row("chat", "") == "chat" and session_row("chat", "app") == "app/chat"


def test_same_tokens_in_two_namespaces_are_two_chains_each_stored_once(store):
    pages = make_pages(CHAIN)
    first = store.save_prefix(FP, pages, namespace="alice")
    assert first.pages_written == 3
    # no rewrite inside one
    assert store.save_prefix(FP, pages, namespace="alice").pages_written == 0
    assert store.save_prefix(FP, pages, namespace="bob").pages_written == 3  # a chain of its own
    assert store.stats().pages == 6 and store.stats().orphan_pages == 0
    assert store.verify().clean  # first pages under a root are whole chains, not broken ones
    index = DiskIndex(FP, store.index(FP))
    alice = index.match(PROMPT, "alice")
    assert [p.key for p in alice] == chain_keys(FP, CHAIN, "alice")
    assert [p.key for p in index.match(PROMPT, "bob")] == chain_keys(FP, CHAIN, "bob")
    assert index.match(PROMPT) == [] and index.match(PROMPT, "carol") == []
    with store.read_chain(FP, [p.key for p in alice], "alice") as reading:
        assert same(list(reading.pages()), pages)
    with store.read_chain(FP, [p.key for p in alice], "bob") as reading:  # not bob's chain
        assert reading.chain == []


def test_a_session_is_read_only_in_its_namespace(store):
    pages = make_pages(CHAIN)
    store.save_session(session_row("chat", "app"), FP, pages, namespace="app")
    assert same(store.load_session("app/chat", FP, namespace="app"), pages)
    # The row found under another namespace's name, or read as another namespace: nothing,
    # and nothing damaged either (the chain is whole, only not theirs).
    assert store.load_session("app/chat", FP, namespace="api") == []
    assert store.load_session("app/chat", FP) == []
    assert store.verify().clean and store.session("app/chat") is not None
    assert same(store.load_session("app/chat", FP, namespace="app"), pages)


def test_a_damaged_page_cuts_a_namespaced_session_back(store, tmp_path):
    pages = make_pages(CHAIN)
    store.save_session("app/chat", FP, pages, namespace="app")
    with closing(sqlite3.connect(str(store.path), isolation_level=None)) as conn:
        conn.execute(
            "UPDATE page_data SET kv = ? WHERE key = ?",
            [b"x" * 256, chain_keys(FP, CHAIN, "app")[2]],
        )
    report = store.verify()
    assert (report.bad_pages, report.sessions_truncated) == (1, 1)
    assert same(store.load_session("app/chat", FP, namespace="app"), pages[:2])


def test_a_store_from_before_namespaces_serves_only_namespace_default(tmp_path):
    """Pages written before namespaces have a NULL parent on their first page: exactly what
    namespace "" writes. Written here by hand, as the old code wrote them."""
    path = tmp_path / "old.db"
    with DiskStore(path) as store:
        pass  # the schema, unchanged by namespaces
    pages = make_pages(CHAIN)
    keys = [page_key(FP, None, CHAIN[0])]
    for tokens in CHAIN[1:]:
        keys.append(page_key(FP, keys[-1], tokens))
    with DiskStore(path) as store:
        store.save_session("chat", FP, pages)
        assert chain_keys(FP, CHAIN) == keys
        index = DiskIndex(FP, store.index(FP))
        assert [p.key for p in index.match(PROMPT)] == keys
        for namespace in ("app", "api"):  # the new front ends' namespaces: a clean miss
            assert index.match(PROMPT, namespace) == []
            assert store.load_session(session_row("chat", namespace), FP, namespace=namespace) == []
            assert store.load_session("chat", FP, namespace=namespace) == []
        assert same(store.load_session("chat", FP), pages) and store.verify().clean


def test_budget_and_clear_see_namespaced_chains(tmp_path):
    with DiskStore(tmp_path / "s.db", budget_bytes=10**9) as store:
        store.save_session("app/a", FP, make_pages([page(0), page(4)]), namespace="app")
        store.save_session("api/a", FP, make_pages([page(0), page(4)]), namespace="api")
        store.save_prefix(FP, make_pages([page(0), page(8)]), namespace="api")
        assert store.stats().orphan_pages == 0 and store.stats().pages == 5
        store.clear("app/a")
        assert store.stats().pages == 3 and store.session("api/a") is not None
        assert len(store.load_session("api/a", FP, namespace="api")) == 2
