"""The Responses API's stored responses: kept per owner, read back after a reopen, deleted,
held to their budget (oldest first), and a file that is not theirs refused in one line."""

from __future__ import annotations

import sqlite3

import pytest

from core.api.responses_store import ResponseStore
from core.errors import StoreError

OUTPUT = [
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A"}]}
]


def response(rid: str, text: str = "A") -> dict:
    return {"id": rid, "object": "response", "output": OUTPUT, "note": text}


def test_a_response_is_kept_for_its_owner_and_survives_a_reopen(tmp_path):
    path = tmp_path / "responses.db"
    store = ResponseStore(path)
    conversation = [{"type": "message", "role": "user", "content": "Q"}]
    store.put("key-a", response("resp_1"), conversation)
    store.close()
    again = ResponseStore(path)
    kept = again.get("resp_1", "key-a")
    assert kept.response == response("resp_1") and kept.conversation == conversation
    assert kept.continued() == (*conversation, *OUTPUT)
    assert again.get("resp_1", "key-b") is None  # another key's
    assert not again.delete("resp_1", "key-b")
    assert again.delete("resp_1", "key-a") and again.get("resp_1", "key-a") is None
    again.close()


def test_the_oldest_go_past_the_budget(tmp_path):
    store = ResponseStore(tmp_path / "responses.db", budget_bytes=1000)
    for i in range(10):
        store.put("api", response(f"resp_{i}", "x" * 200), [])
    kept = [i for i in range(10) if store.get(f"resp_{i}", "api") is not None]
    assert kept and kept == list(range(10 - len(kept), 10)) and len(kept) < 10
    store.close()


def test_a_foreign_database_is_one_line(tmp_path):
    path = tmp_path / "responses.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE other (x)")
    store = ResponseStore(path)
    with pytest.raises(StoreError, match="not RadixChat's stored responses"):
        store.get("resp_1", "api")
