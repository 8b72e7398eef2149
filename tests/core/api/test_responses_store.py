"""The Responses API's stored responses: kept per owner and read back after a reopen; a
continuation stored as a link (a chain's bytes grow linearly), read back whole; sizes in
UTF-8 bytes; a share per API key (one key's writes never evict another's); deleting or
evicting a response that others continue keeps them whole; caps; the disk's reserve; a
damaged file set aside; the migration from schema 1."""

from __future__ import annotations

import json
import shutil
import sqlite3
from contextlib import closing

import pytest

from core.api.responses_room import StoreBudget
from core.api.responses_store import Missing, ResponseStore, Turn
from core.api.responses_tables import ROW_BYTES
from core.errors import StoreError

BIG = 10**9  # a budget nothing here reaches


def output(text: str = "A") -> list[dict]:
    return [
        {
            "id": "msg_out",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        }
    ]


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def turn(rid: str, text: str = "Q", previous: str | None = None, answer: str = "A") -> Turn:
    response = {"id": rid, "object": "response", "output": output(answer), "note": "x"}
    return Turn(response, [user(text)], output(answer), previous)


def open_store(tmp_path, total: int = BIG, owners: tuple[str, ...] = (), reserve: int = 0):
    return ResponseStore(tmp_path / "responses.db", StoreBudget(total, owners, reserve))


def chain(store: ResponseStore, owner: str, n: int, text: str, prefix: str = "r") -> list[str]:
    ids, previous = [], None
    for i in range(n):
        rid = f"{prefix}{i}"
        assert store.put(owner, turn(rid, f"{text}{i}", previous)).stored
        ids.append(rid)
        previous = rid
    return ids


def test_a_response_is_kept_for_its_owner_and_survives_a_reopen(tmp_path):
    store = open_store(tmp_path)
    assert store.put("key-a", turn("resp_1")).stored
    store.close()
    again = open_store(tmp_path)
    assert again.get("resp_1", "key-a") == turn("resp_1").response
    assert again.history("resp_1", "key-a").items == (user("Q"), *output())
    assert again.get("resp_1", "key-b") is None  # another key's
    assert again.history("resp_1", "key-b") is None
    assert not again.delete("resp_1", "key-b")
    assert again.delete("resp_1", "key-a") and again.get("resp_1", "key-a") is None
    again.close()


def test_a_chain_is_stored_as_links_and_read_back_whole(tmp_path):
    """Today every row repeated the whole conversation: 45 links of a 7.5 MB field made one
    row of 337 MB. Here 30 links of a 40 KB field: each row holds its own items only."""
    store = open_store(tmp_path)
    field = "ü" * 20_000  # 40 KB in UTF-8
    ids = chain(store, "api", 30, field)
    history = store.history(ids[-1], "api")
    assert history.items == tuple(
        item for i in range(30) for item in (user(f"{field}{i}"), *output())
    )
    one_row = store.usage() / 30
    assert 40_000 < one_row < 42_000  # linear: each link its own 40 KB (no copies)
    assert history.bytes == store.usage()
    store.close()
    # the file too: about 1.2 MB of text, not the 18 MB a copy per row would take
    assert (tmp_path / "responses.db").stat().st_size < 3 * 30 * 40_000


def test_sizes_are_utf8_bytes_not_characters(tmp_path):
    """Today 6,292,579 bytes stored counted as 1,573,987 (characters)."""
    text = "😀" * 10_000  # 10,000 characters, 40,000 bytes
    store = open_store(tmp_path, total=400_000, owners=("api",))
    for i in range(10):  # 100,000 characters: all would fit, counted so
        assert store.put("api", turn(f"r{i}", text)).stored
    assert store.get("r0", "api") is None and store.get("r9", "api") is not None
    assert store.usage() <= 400_000
    assert store.history("r9", "api").bytes >= 40_000
    store.close()


def test_the_oldest_go_past_the_budget(tmp_path):
    store = open_store(tmp_path, total=10 * (ROW_BYTES + 400))
    for i in range(20):
        assert store.put("api", turn(f"resp_{i}", "x" * 200)).stored
    kept = [i for i in range(20) if store.get(f"resp_{i}", "api") is not None]
    assert kept and kept == list(range(20 - len(kept), 20)) and len(kept) < 20
    assert store.usage() <= 10 * (ROW_BYTES + 400)
    store.close()


def test_one_key_never_evicts_anothers(tmp_path):
    """Today the budget was one pool, oldest first: key A's 36 large stores evicted key B's
    response (GET and continuation 404)."""
    share = 50_000
    store = open_store(tmp_path, total=2 * share, owners=("key-a", "key-b"))
    assert store.put("key-b", turn("b0", "b's question")).stored
    for i in range(36):
        assert store.put("key-a", turn(f"a{i}", "a" * 8_000)).stored
    assert store.get("b0", "key-b") is not None
    assert store.history("b0", "key-b").items[0] == user("b's question")
    assert store.usage("key-a") <= share  # a's own oldest went instead
    assert store.get("a0", "key-a") is None and store.get("a35", "key-a") is not None
    store.close()


def test_keys_no_longer_served_are_evicted_first(tmp_path):
    store = open_store(tmp_path, total=80_000, owners=("old",))
    for i in range(8):
        assert store.put("old", turn(f"old{i}", "o" * 8_000)).stored
    store.close()
    store = open_store(tmp_path, total=80_000, owners=("new-a", "new-b"))  # old's key is gone
    for i in range(2):
        assert store.put("new-a", turn(f"a{i}", "a" * 8_000)).stored
    assert store.get("old0", "old") is None and store.get("old7", "old") is not None
    assert store.get("a0", "new-a") is not None
    store.close()


def test_eviction_takes_leaves_so_every_chain_left_is_whole(tmp_path):
    store = open_store(tmp_path, total=12 * (ROW_BYTES + 600), owners=("api",))
    first = chain(store, "api", 6, "x" * 300, "a")
    for i in range(6):
        store.put("api", turn(f"solo{i}", "y" * 300))
    second = chain(store, "api", 6, "z" * 300, "b")
    assert store.get(second[-1], "api") is not None
    left = [rid for rid in first if store.get(rid, "api") is not None]
    assert left == first[: len(left)]  # the chain went from its newest end
    for rid in [*left, *second]:  # whatever is left reads back to its first response
        assert len(store.history(rid, "api").items) == 2 * (int(rid[1:]) + 1)
    store.close()


def test_deleting_a_response_others_continue_hides_it(tmp_path):
    store = open_store(tmp_path)
    ids = chain(store, "api", 3, "q")
    before = store.usage()
    assert store.delete(ids[1], "api")
    assert store.get(ids[1], "api") is None and store.history(ids[1], "api") is None
    assert not store.delete(ids[1], "api")  # gone for its owner
    assert len(store.history(ids[2], "api").items) == 6  # its continuation is whole
    assert store.usage() == before  # kept for it, counted in the key's share
    assert store.delete(ids[2], "api")  # the last continuation goes: the hidden one with it
    assert store.usage() < before - store.usage() / 2
    assert store.get(ids[0], "api") is not None
    assert not store.put("api", turn("late", previous=ids[1])).stored  # gone: no link to it
    store.close()


def test_caps_refuse_what_can_never_fit(tmp_path):
    store = open_store(tmp_path, total=40_000, owners=("api",))
    too_big = store.put("api", turn("big", "x" * 20_000))  # one response: a quarter of a share
    assert not too_big.stored and too_big.refusal.kind == "item"
    assert "may take 10,000" in too_big.refusal.message
    ids = chain(store, "api", 4, "y" * 8_000)
    longer = store.put("api", turn("more", "y" * 8_000, previous=ids[-1]))
    assert not longer.stored and longer.refusal.kind == "owner"  # the chain must stay
    assert len(store.history(ids[-1], "api").items) == 8  # nothing evicted by the refusal
    store.close()


def test_a_write_never_eats_into_the_disks_reserve(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    store = open_store(tmp_path, reserve=free - 50 * 2**20)  # 50 MB left before the reserve
    assert store.put("api", turn("small", "x" * 1_000)).stored
    refused = store.put("api", turn("large", "x" * 30 * 2**20))  # 60 MB with its log
    assert not refused.stored and refused.refusal.kind == "disk"
    assert store.get("large", "api") is None and store.get("small", "api") is not None
    store.close()


def test_a_lowered_budget_is_met_on_open(tmp_path):
    store = open_store(tmp_path)
    for i in range(10):
        store.put("api", turn(f"r{i}", "x" * 2_000))
    store.close()
    store = open_store(tmp_path, total=5 * 2_000)
    assert store.usage() <= 5 * 2_000 and store.get("r9", "api") is not None
    store.close()


def test_a_damaged_file_is_set_aside_and_started_again(tmp_path):
    """Today: POST answered 200 with store: true but stored nothing, and GET was a 503
    until the file was deleted by hand."""
    store = open_store(tmp_path)
    for i in range(40):
        store.put("api", turn(f"r{i}", "x" * 4_000))
    store.close()
    path = tmp_path / "responses.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # cut in half
    store = open_store(tmp_path)
    assert store.get("r39", "api") is None  # what was in it is set aside, not an error
    assert store.put("api", turn("fresh")).stored
    assert store.get("fresh", "api") is not None
    store.close()
    assert (tmp_path / "responses.db.damaged-1").exists()


def test_a_foreign_database_is_set_aside(tmp_path):
    path = tmp_path / "responses.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE other (x)")
    store = open_store(tmp_path)
    assert store.get("resp_1", "api") is None
    assert store.put("api", turn("resp_1")).stored
    store.close()
    with closing(sqlite3.connect(tmp_path / "responses.db.damaged-1")) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("other",)]


def test_a_newer_schema_is_one_line(tmp_path):
    path = tmp_path / "responses.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA user_version = 99")
    store = open_store(tmp_path)
    with pytest.raises(StoreError, match="newer RadixChat"):
        store.get("resp_1", "api")
    store.close()


def test_a_schema_1_file_is_migrated(tmp_path):
    """Rows of schema 1 held their whole conversation: each is read back as it was, its
    size counted again in bytes."""
    path = tmp_path / "responses.db"
    conversation = [user("Q1"), *output("A1"), user("Qé")]
    response = {"id": "old", "object": "response", "output": output("A2"), "x": 1}
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(
            "CREATE TABLE responses (id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at REAL "
            "NOT NULL, response TEXT NOT NULL, conversation TEXT NOT NULL, bytes INTEGER NOT NULL)"
        )
        conn.execute("CREATE INDEX responses_created ON responses(created_at)")
        conn.execute(
            "INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?)",
            [
                "old",
                "key-x",
                1.0,
                json.dumps(response, ensure_ascii=False),
                json.dumps(conversation, ensure_ascii=False),
                3,
            ],
        )
        conn.execute("PRAGMA user_version = 1")
        conn.commit()
    store = open_store(tmp_path)
    assert store.get("old", "key-x") == response
    assert store.history("old", "key-x").items == (*conversation, *output("A2"))
    assert store.usage("key-x") > ROW_BYTES + 100
    assert store.put("key-x", turn("new", previous="old")).stored
    assert len(store.history("new", "key-x").items) == 6
    store.close()


def conversation_item(n: int, text: str = "hi") -> dict:
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    }


def test_conversations_hold_their_items_in_order_for_their_owner(tmp_path):
    store = open_store(tmp_path)
    made = store.create_conversation("api", {"topic": "x"}, [conversation_item(0)])
    cid = made["id"]
    assert made["object"] == "conversation" and made["metadata"] == {"topic": "x"}
    assert store.add_items(cid, "api", [conversation_item(n) for n in (1, 2, 3)]) is None
    assert [i["id"] for i in store.conversation_items(cid, "api").items] == [
        f"msg_{n}" for n in range(4)
    ]
    page = store.list_items(cid, "api", limit=2)
    assert [i["id"] for i in page.items] == ["msg_3", "msg_2"] and page.has_more
    page = store.list_items(cid, "api", after="msg_2", limit=2)
    assert [i["id"] for i in page.items] == ["msg_1", "msg_0"] and not page.has_more
    page = store.list_items(cid, "api", after="msg_1", ascending=True)
    assert [i["id"] for i in page.items] == ["msg_2", "msg_3"]
    before = store.conversation_items(cid, "api").bytes
    store.delete_item(cid, "api", "msg_2")
    assert store.conversation_items(cid, "api").bytes < before
    assert store.item(cid, "api", "msg_3") == conversation_item(3)
    with pytest.raises(Missing):
        store.item(cid, "api", "msg_2")
    for attempt in (
        lambda: store.conversation(cid, "other"),
        lambda: store.add_items(cid, "other", [conversation_item(9)]),
        lambda: store.delete_conversation(cid, "other"),
    ):
        with pytest.raises(Missing):
            attempt()
    assert store.update_conversation(cid, "api", {"topic": "y"})["metadata"] == {"topic": "y"}
    store.delete_conversation(cid, "api")
    with pytest.raises(Missing):
        store.conversation(cid, "api")
    assert store.usage() == 0
    store.close()


def test_a_turn_in_a_conversation_adds_its_items_and_shares_the_keys_budget(tmp_path):
    store = open_store(tmp_path, total=2 * 30_000, owners=("key-a", "key-b"))
    cid = store.create_conversation("key-b", {}, [])["id"]
    response = {"id": "resp_c", "object": "response", "output": output()}
    saved = store.put("key-b", Turn(response, [conversation_item(0)], output(), conversation=cid))
    assert saved.stored
    assert [i["type"] for i in store.conversation_items(cid, "key-b").items] == ["message"] * 2
    assert store.history("resp_c", "key-b").conversation == cid
    for i in range(20):  # key A fills its share: B's conversation stays
        store.put("key-a", turn(f"a{i}", "a" * 6_000))
    assert len(store.conversation_items(cid, "key-b").items) == 2
    store.delete_conversation(cid, "key-b")
    gone = store.put("key-b", Turn(None, [conversation_item(1)], output(), conversation=cid))
    assert not gone.stored and gone.refusal.kind == "gone"
    store.close()


def test_clear_deletes_everything(tmp_path):
    store = open_store(tmp_path)
    chain(store, "api", 5, "x" * 10_000)
    store.create_conversation("api", {}, [conversation_item(0)])
    cleared = store.clear()
    assert (cleared.responses, cleared.conversations) == (5, 1) and cleared.bytes > 40_000
    assert store.usage() == 0
    store.close()
