"""`radixchat cache`: a chat's cache found by its name; every store, the single one and each
rank's."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

import pytest

from core import paths
from core.api.responses_store import ResponseStore, Turn
from core.cli.main import main
from kvcache.store import DiskStore, PageData, session_row


def test_clearing_a_chat_by_its_name(tmp_path, capsys):
    with DiskStore(paths.kv_cache_db_path(tmp_path)) as store:
        for name in (session_row("trip", "app"), session_row("trip", "api")):
            store.save_session(
                name, "fp", [PageData((1, 2, 3), b"kv" * 100)], namespace=name.split("/")[0]
            )
    assert main(["cache", "clear", "--session", "trip", "--data-dir", str(tmp_path)]) == 0
    assert "cleared the cache of session trip" in capsys.readouterr().out
    with DiskStore(paths.kv_cache_db_path(tmp_path)) as store:
        # an API client's "trip" is not the chat
        assert [s.name for s in store.sessions()] == ["api/trip"]


def write_stores(root, names: dict[str, int]) -> None:
    """A store per file name, with ``names[name]`` one-page sessions."""
    for name, count in names.items():
        with DiskStore(root / name) as store:
            for i in range(count):
                store.save_session(
                    session_row(f"s{i}", "api"),
                    "fp",
                    [PageData((i, 2, 3), b"kv" * 500)],
                    namespace="api",
                )


def test_stats_lists_every_ranks_store_beside_the_single_one(tmp_path, capsys):
    write_stores(
        tmp_path,
        {
            "kvcache.db": 1,
            "kvcache-rank1of2.db": 3,
            "kvcache-rank0of2.db": 2,
            "kvcache-rank0of4.db": 1,
        },
    )
    assert main(["cache", "stats", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    ranks = [line for line in out if line.startswith("rank")]
    assert [line.split()[0] for line in ranks] == ["rank0of2", "rank1of2", "rank0of4"]
    assert "(kvcache-rank1of2.db): 3 sessions, 0 unnamed prefixes, 3 pages" in ranks[1]
    assert out[0].startswith(str(tmp_path / "kvcache.db")) and "1 sessions" in out[0]
    assert main(["cache", "stats", "--json", "--data-dir", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pages"] == 1
    assert [(r["store"], r["pages"], r["bytes"] > 0) for r in report["rank_stores"]] == [
        ("rank0of2", 2, True),
        ("rank1of2", 3, True),
        ("rank0of4", 1, True),
    ]


def test_stats_of_a_group_only_folder(tmp_path, capsys):
    write_stores(tmp_path, {"kvcache-rank0of2.db": 1})
    assert main(["cache", "stats", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no KV cache at" in out and "rank0of2 (kvcache-rank0of2.db): 1 sessions" in out


def test_clear_clears_every_store_or_the_one_asked(tmp_path, capsys):
    write_stores(tmp_path, {"kvcache.db": 1, "kvcache-rank0of2.db": 2, "kvcache-rank1of2.db": 2})

    def pages() -> dict[str, int]:
        counts = {}
        for name in ("kvcache.db", "kvcache-rank0of2.db", "kvcache-rank1of2.db"):
            with DiskStore(tmp_path / name) as store:
                counts[name] = store.stats().pages
        return counts

    assert main(["cache", "clear", "--store", "rank1of2", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("rank1of2: cleared the cache of all sessions")
    assert pages() == {"kvcache.db": 1, "kvcache-rank0of2.db": 2, "kvcache-rank1of2.db": 0}
    assert main(["cache", "clear", "--session", "api/s1", "--data-dir", str(tmp_path)]) == 0
    # s1 from every store
    assert pages() == {"kvcache.db": 1, "kvcache-rank0of2.db": 1, "kvcache-rank1of2.db": 0}
    capsys.readouterr()
    assert main(["cache", "clear", "--data-dir", str(tmp_path)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3  # one line a store
    assert pages() == {"kvcache.db": 0, "kvcache-rank0of2.db": 0, "kvcache-rank1of2.db": 0}
    assert main(["cache", "clear", "--store", "rank2of2", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "no KV cache store 'rank2of2'" in err[0]
        and "single, rank0of2, rank1of2" in err[0]
    )


@pytest.mark.faults
def test_verify_says_clean_or_repaired_for_every_store(tmp_path, capsys):
    """Today: `cache verify` without --json ended in a traceback (KeyError: 'clean')."""
    write_stores(tmp_path, {"kvcache.db": 2, "kvcache-rank0of2.db": 1})
    assert main(["cache", "verify", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        (
            "checked 2 pages: 0 bad (dropped), 0 sessions cut back, 0 dropped, 0 orphan pages "
            "removed — clean"
        ),
        "rank0of2: checked 1 pages: 0 bad (dropped), 0 sessions cut back, 0 dropped, "
        "0 orphan pages removed — clean",
    ]
    with closing(sqlite3.connect(tmp_path / "kvcache.db")) as conn, conn:
        conn.execute(
            "UPDATE page_data SET kv = ? WHERE rowid = (SELECT min(rowid) FROM page_data)",
            [b"damaged"],
        )
    assert main(["cache", "verify", "--data-dir", str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (
        "checked 2 pages: 1 bad (dropped), 0 sessions cut back, 1 dropped, 0 orphan pages "
        "removed — repaired"
    )
    assert main(["cache", "verify", "--json", "--data-dir", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["pages_checked"], report["clean"]) == (1, True)
    assert [(r["store"], r["clean"]) for r in report["rank_stores"]] == [("rank0of2", True)]


def test_clear_reaches_the_stored_responses_and_conversations(tmp_path, capsys):
    """Today `cache clear` left responses.db where it was."""
    store = ResponseStore(paths.responses_db_path(tmp_path))
    for n in range(3):
        response = {"id": f"resp_{n}", "object": "response", "output": []}
        assert store.put(
            "api", Turn(response, [{"role": "user", "content": "x" * 1000}], [])
        ).stored
    store.create_conversation("api", {}, [])
    store.close()
    assert main(["cache", "clear", "--session", "s", "--data-dir", str(tmp_path)]) == 0
    store = ResponseStore(paths.responses_db_path(tmp_path))
    assert store.get("resp_0", "api") is not None  # a chat's cache cleared: nothing else
    store.close()
    capsys.readouterr()
    assert main(["cache", "clear", "--data-dir", str(tmp_path)]) == 0
    assert "deleted 3 stored responses and 1 conversations" in capsys.readouterr().out
    store = ResponseStore(paths.responses_db_path(tmp_path))
    assert store.get("resp_0", "api") is None and store.usage() == 0
    store.close()
