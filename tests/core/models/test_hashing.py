"""The one SHA-256 file reader and the one rule for remembering a hash: by path, size
and mtime. Reads are counted by wrapping ``hashing.sha256_file``, which every cached
lookup goes through."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from core.models import hashing
from core.models.hashing import FileDigest, FileHashCache, recheck, sha256_file


@pytest.fixture
def reads(monkeypatch):
    """The paths ``sha256_file`` read, in order."""
    seen = []
    real = hashing.sha256_file

    def counting(path, on_fraction=None):
        seen.append(os.fspath(path))
        return real(path, on_fraction)

    monkeypatch.setattr(hashing, "sha256_file", counting)
    return seen


def bump_mtime(path, by_ns=10**9):
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + by_ns))


def test_sha256_file_matches_hashlib_across_blocks(tmp_path):
    data = os.urandom(hashing.CHUNK + 12345)  # two blocks, the second one partial
    path = tmp_path / "w.bin"
    path.write_bytes(data)
    fractions = []
    assert sha256_file(path, fractions.append) == hashlib.sha256(data).hexdigest()
    assert fractions == [hashing.CHUNK / len(data), 1.0]


def test_sha256_file_of_an_empty_file(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    fractions = []
    assert sha256_file(path, fractions.append) == hashlib.sha256(b"").hexdigest()
    assert fractions == []  # no block was read


def test_unchanged_file_is_not_read_again(tmp_path, reads):
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    cache = FileHashCache(tmp_path / "hashes.json")
    assert cache.sha256(path) == hashlib.sha256(b"abc").hexdigest()
    assert cache.sha256(path) == hashlib.sha256(b"abc").hexdigest()
    assert (
        FileHashCache(tmp_path / "hashes.json").sha256(path) == hashlib.sha256(b"abc").hexdigest()
    )
    assert reads == [str(path.resolve())]  # once, for the first call only


def test_changed_mtime_rehashes(tmp_path, reads):
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    cache = FileHashCache(tmp_path / "hashes.json")
    cache.sha256(path)
    bump_mtime(path)
    assert cache.sha256(path) == hashlib.sha256(b"abc").hexdigest()
    assert len(reads) == 2
    assert (
        FileHashCache(tmp_path / "hashes.json").sha256(path) == hashlib.sha256(b"abc").hexdigest()
    )
    assert len(reads) == 2  # the new mtime was remembered on disk


def test_changed_size_rehashes_even_with_the_same_mtime(tmp_path, reads):
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    mtime = path.stat().st_mtime_ns
    cache = FileHashCache(tmp_path / "hashes.json")
    cache.sha256(path)
    path.write_bytes(b"abcd")
    os.utime(path, ns=(mtime, mtime))
    assert cache.sha256(path) == hashlib.sha256(b"abcd").hexdigest()
    assert len(reads) == 2


def test_remembered_hash_is_trusted_until_the_file_changes(tmp_path, reads):
    """``remember`` records a hash checked elsewhere; the file is not read for it."""
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    cache = FileHashCache(tmp_path / "hashes.json")
    cache.remember(path, "f" * 64)
    assert FileHashCache(tmp_path / "hashes.json").sha256(path) == "f" * 64 and reads == []
    bump_mtime(path)
    assert cache.sha256(path) == hashlib.sha256(b"abc").hexdigest() and len(reads) == 1


def test_same_file_by_another_path_shares_the_entry(tmp_path, reads):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    cache = FileHashCache(None)  # memory only
    cache.sha256(path)
    cache.sha256(tmp_path / "sub" / ".." / "w.bin")
    assert len(reads) == 1


def test_damaged_store_costs_only_a_rehash(tmp_path, reads):
    store = tmp_path / "hashes.json"
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    for junk in ("{not json", "[1, 2]", json.dumps({str(path.resolve()): {"sha256": "x"}})):
        store.write_text(junk)
        assert FileHashCache(store).sha256(path) == hashlib.sha256(b"abc").hexdigest()
    assert len(reads) == 3
    # repaired
    assert FileDigest.from_json(json.loads(store.read_text())[str(path.resolve())]) is not None


def test_unwritable_store_still_hashes(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    store = tmp_path / "missing-folder" / "hashes.json"
    assert FileHashCache(store).sha256(path) == hashlib.sha256(b"abc").hexdigest()
    assert not store.exists() and not list(tmp_path.glob("missing-folder*"))


def test_store_format_reads_the_former_fingerprint_cache(tmp_path, reads):
    """Entries written before the move (``{size, mtime_ns, sha256}`` by path) still count."""
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    st = path.stat()
    old = {
        str(path.resolve()): {"mtime_ns": st.st_mtime_ns, "sha256": "e" * 64, "size": st.st_size}
    }
    (tmp_path / "hashes.json").write_text(json.dumps(old))
    assert FileHashCache(tmp_path / "hashes.json").sha256(path) == "e" * 64 and reads == []


def test_recheck(tmp_path, reads):
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    fresh = recheck(path, None)
    assert fresh == FileDigest(hashlib.sha256(b"abc").hexdigest(), 3, path.stat().st_mtime_ns)
    assert recheck(path, fresh) is fresh and len(reads) == 1
    stale = FileDigest("0" * 64, 3, fresh.mtime_ns - 1)
    assert recheck(path, stale) == fresh and len(reads) == 2


def test_data_folder_cache_lives_in_one_file(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"abc")
    FileHashCache.in_data_folder(tmp_path).sha256(path)
    assert list(json.loads((tmp_path / hashing.HASHES_FILE).read_text())) == [str(path.resolve())]
