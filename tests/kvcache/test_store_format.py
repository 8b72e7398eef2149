"""The disk store's format without a store: page keys, checksums, damage checks, rows,
and the schema's live-page walk on a bare SQLite database."""

from __future__ import annotations

import zlib

import pytest
from sqlite_utils import Database

from kvcache.store_format import (
    LIVE_PAGES,
    MIGRATIONS,
    SCHEMA_VERSION,
    PageData,
    chain_keys,
    pack_tokens,
    page_checksum,
    page_key,
    page_problem,
    page_rows,
    unpack_tokens,
)

FP = "f" * 64


def test_tokens_pack_as_int32_and_back():
    blob = pack_tokens([0, 1, -1, 2**31 - 1, -(2**31)])
    assert len(blob) == 20 and blob[:8] == b"\0\0\0\0\x01\0\0\0"  # little-endian
    assert unpack_tokens(blob) == (0, 1, -1, 2**31 - 1, -(2**31))


@pytest.mark.parametrize("tokens, message", [([], "at least one"), ([2**31], "int32")])
def test_tokens_that_cannot_be_packed(tokens, message):
    with pytest.raises(ValueError, match=message):
        pack_tokens(tokens)


def test_page_key_names_fingerprint_parent_and_tokens():
    key = page_key(FP, None, [1, 2, 3])
    assert len(key) == 64 and int(key, 16) >= 0
    assert page_key(FP, None, pack_tokens([1, 2, 3])) == key  # packed or not: the same key
    assert page_key(FP, "", [1, 2, 3]) == key  # a first page's parent is ""
    others = {
        page_key("e" * 64, None, [1, 2, 3]),
        page_key(FP, key, [1, 2, 3]),
        page_key(FP, None, [1, 2, 4]),
        page_key(FP, None, [1, 2]),
    }
    assert key not in others and len(others) == 4


def test_length_prefixes_keep_parts_apart():
    """Moving bytes from one part to the next gives another key (no shared encoding)."""
    assert page_key("ab", "c", [1]) != page_key("a", "bc", [1])


def test_chain_keys_link_each_page_to_its_parent():
    pages = [[1, 2], [3, 4], [5]]
    keys = chain_keys(FP, pages)
    assert keys[0] == page_key(FP, None, [1, 2])
    assert keys[1] == page_key(FP, keys[0], [3, 4]) and keys[2] == page_key(FP, keys[1], [5])
    assert chain_keys(FP, pages[:2]) == keys[:2]  # a shared prefix has shared keys
    assert chain_keys(FP, [[9], [3, 4]])[1] != keys[1]  # same page after another parent
    assert chain_keys(FP, []) == []


def test_checksum_is_crc32_over_the_length_prefixed_parts():
    tokens, kv = pack_tokens([1, 2]), b"kv-bytes"
    crc = zlib.crc32(len(tokens).to_bytes(8, "little"))
    crc = zlib.crc32(tokens, crc)
    crc = zlib.crc32(len(kv).to_bytes(8, "little"), crc)
    crc = zlib.crc32(kv, crc)
    crc = zlib.crc32(b"\xff" * 8, crc)
    assert page_checksum(tokens, kv, None) == f"crc32:{crc:08x}"
    # empty differs from missing
    assert page_checksum(tokens, kv, b"") != page_checksum(tokens, kv, None)
    assert page_checksum(tokens, kv + b"\0", None) != page_checksum(tokens, kv, None)


def test_page_problem_finds_each_kind_of_damage():
    tokens, kv, snap = pack_tokens([1, 2, 3]), b"\x01" * 32, b"state"
    key, checksum = page_key(FP, None, tokens), page_checksum(tokens, kv, snap)
    assert page_problem(key, None, FP, tokens, checksum, kv, snap) is None
    assert "key does not match" in page_problem(key, None, "e" * 64, tokens, checksum, kv, snap)
    assert "key does not match" in page_problem(key, "p" * 64, FP, tokens, checksum, kv, snap)
    # torn int32
    assert "key does not match" in page_problem(key, None, FP, tokens[:-1], checksum, kv, snap)
    assert "key does not match" in page_problem(key, None, FP, b"", checksum, kv, snap)
    assert page_problem(key, None, FP, tokens, checksum, None, snap) == "no K/V data"
    flipped = bytes([kv[0] ^ 1]) + kv[1:]
    assert page_problem(key, None, FP, tokens, checksum, flipped, snap) == "checksum mismatch"
    assert page_problem(key, None, FP, tokens, checksum, kv[:-1], snap) == "checksum mismatch"
    assert page_problem(key, None, FP, tokens, checksum, kv, None) == "checksum mismatch"


def test_page_rows_describe_a_new_page():
    page = PageData(tokens=(4, 5), kv=b"x" * 10, snapshot=b"yy")
    key = page_key(FP, None, page.tokens)
    meta, data = page_rows(FP, key, None, page)
    assert meta == {
        "key": key,
        "parent": None,
        "fingerprint": FP,
        "tokens": pack_tokens([4, 5]),
        "nbytes": 8 + 10 + 2,
        "checksum": page_checksum(pack_tokens([4, 5]), b"x" * 10, b"yy"),
    }
    assert data == {"key": key, "kv": b"x" * 10, "snapshot": b"yy"}
    assert (
        page_problem(key, None, FP, meta["tokens"], meta["checksum"], data["kv"], data["snapshot"])
        is None
    )


def test_schema_and_live_pages(tmp_path):
    db = Database(tmp_path / "s.db")
    for migrate in MIGRATIONS:
        migrate(db)
    assert SCHEMA_VERSION == len(MIGRATIONS)
    assert {"pages", "page_data", "sessions", "counters"} <= set(db.table_names())
    keys = chain_keys(FP, [[1], [2], [3]])
    branch = page_key(FP, keys[0], [9])
    orphan = page_key(FP, None, [7])
    for key, parent, tokens in [
        (keys[0], None, [1]),
        (keys[1], keys[0], [2]),
        (keys[2], keys[1], [3]),
        (branch, keys[0], [9]),
        (orphan, None, [7]),
    ]:
        meta, data = page_rows(FP, key, parent, PageData(tuple(tokens), b"kv"))
        db["pages"].insert({**meta, "last_used": 0.0})
        db["page_data"].insert(data)
    for name, head in [("a", keys[2]), ("b", branch)]:
        db["sessions"].insert(
            {
                "name": name,
                "fingerprint": FP,
                "head": head,
                "tokens": 0,
                "pages": 0,
                "nbytes": 0,
                "updated_at": 0.0,
                "last_used": 0.0,
            }
        )
    live = {row[0] for row in db.execute(LIVE_PAGES + " SELECT key FROM live").fetchall()}
    assert live == {*keys, branch}  # the shared first page once; the orphan is not live
