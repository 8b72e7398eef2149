"""A full disk (a real 8 MB tmpfs as the data folder): the chat history wins over the KV
cache and the stored responses, a reply is always shown, ``cache clear`` works (and reaches
the stored responses), nothing crashes."""

from __future__ import annotations

import json
import random
import re

import pytest

from core import paths
from core.api.responses_room import StoreBudget
from core.api.responses_store import ResponseStore, Turn
from core.chats.store import ChatStore
from core.cli.main import main
from kvcache.sqlite_file import remove_files
from kvcache.store import DiskStore, PageData
from tests.faults.conftest import fill, free

pytestmark = pytest.mark.faults

FP = "model-a"
PAGE_BYTES = 64 * 1024


def session_pages(n: int, pages: int = 8) -> list[PageData]:
    """A session of ``pages`` pages of 64 KB of random K/V (random: nothing compresses)."""
    rng = random.Random(n)
    return [
        PageData(tuple(range(1000 * n + 16 * i, 1000 * n + 16 * i + 16)), rng.randbytes(PAGE_BYTES))
        for i in range(pages)
    ]


def test_the_cache_stops_short_of_its_reserve_and_chats_still_save(small_disk):
    """Today's store filled the disk to the last byte (its 10 GB budget never saw the free
    space), then chats.db could not be written."""
    reserve = 2 * 2**20
    with DiskStore(small_disk / "kvcache.db", reserve_bytes=reserve) as store:
        # 8 MB of pages
        results = [store.save_session(f"s{n}", FP, session_pages(n)) for n in range(16)]
        # it did cache while there was room
        assert sum(r.bytes_written for r in results) > 2 * 2**20
        assert any(r.pages_written == 0 for r in results)  # and then gave way
        assert store.load_session("s0", FP)  # what it holds is whole
    assert free(small_disk) >= reserve // 2
    with ChatStore(paths.chats_db_path(small_disk)) as chats:
        session = chats.create_session("kept")
        chats.add_turn(session.id, "q" * 100_000, "a" * 100_000)
        assert len(chats.messages(session.id)) == 2


def stored_turn(n: int, size: int = 300_000) -> Turn:
    """A response whose input is ``size`` bytes of text (random: nothing repeats)."""
    text = random.Random(n).randbytes(size // 2).hex()
    response = {"id": f"resp_{n}", "object": "response", "output": []}
    return Turn(response, [{"type": "message", "role": "user", "content": text}], [])


def test_stored_responses_stop_short_of_their_reserve_and_chats_still_save(small_disk):
    """Today: on a 400 MB data disk, 54 requests filled it while the store counted ~97 MB;
    then chats could not be written."""
    reserve = 2 * 2**20
    store = ResponseStore(small_disk / "responses.db", StoreBudget(2**40, reserve_bytes=reserve))
    saved = [store.put("api", stored_turn(n)) for n in range(30)]  # 9 MB on an 8 MB disk
    assert sum(s.stored for s in saved) >= 5  # it stored while there was room
    refused = [s.refusal for s in saved if not s.stored]
    assert refused and {r.kind for r in refused} == {"disk"}  # and then gave way
    assert store.get("resp_0", "api") is not None  # what it holds is whole
    store.close()
    assert free(small_disk) >= reserve // 2
    with ChatStore(paths.chats_db_path(small_disk)) as chats:
        session = chats.create_session("kept")
        chats.add_turn(session.id, "q" * 100_000, "a" * 100_000)
        assert len(chats.messages(session.id)) == 2


def test_cache_clear_reaches_the_stored_responses_on_a_full_disk(small_disk, capsys):
    """Today `cache clear` freed 4 MB and left responses.db (1.34 GB) where it was."""
    store = ResponseStore(small_disk / "responses.db", StoreBudget(2**40, reserve_bytes=0))
    for n in range(10):
        assert store.put("api", stored_turn(n)).stored
    store.close()
    fill(small_disk)
    assert free(small_disk) < 4096
    assert main(["cache", "clear", "--data-dir", str(small_disk)]) == 0
    out = capsys.readouterr().out
    # (clearing needs a write: on a full disk the files go instead)
    assert "deleted the stored responses" in out and "MB freed" in out
    assert free(small_disk) > 2_000_000
    (small_disk / "filler").unlink()
    store = ResponseStore(small_disk / "responses.db")
    assert store.get("resp_0", "api") is None and store.usage() == 0
    store.close()


def test_the_default_reserve_leaves_a_small_disk_to_the_chats(small_disk):
    with DiskStore(small_disk / "kvcache.db") as store:  # max(1 GB, 5 %) > 8 MB: no room at all
        assert store.disk_room() < 0
        result = store.save_session("s", FP, session_pages(0))
        assert result.pages_written == 0 and store.session("s") is None


def test_the_cache_gives_space_back_when_the_disk_passes_its_reserve(small_disk):
    path = small_disk / "kvcache.db"
    reserve = 2 * 2**20
    with DiskStore(path, reserve_bytes=reserve) as store:
        for n in range(4):
            store.save_session(f"s{n}", FP, session_pages(n))
    size = path.stat().st_size
    assert size > 2 * 2**20
    # something else takes the disk past the reserve
    filler = fill(small_disk, leave=3 * reserve // 4)
    before = free(small_disk)
    with DiskStore(path, reserve_bytes=reserve) as store:
        store.enforce_budget()
        assert store.sessions() == []  # the cache is only time: it all goes
    assert path.stat().st_size < size // 4 and free(small_disk) >= before + 2 * 2**20
    filler.unlink()


def test_cache_clear_works_on_a_full_disk(small_disk, capsys):
    """Today: 'the disk is full' (clearing needs a write), exit 2, the cache keeps the disk."""
    with DiskStore(small_disk / "kvcache.db", reserve_bytes=0) as store:
        for n in range(3):
            store.save_session(f"s{n}", FP, session_pages(n))
    fill(small_disk)
    assert free(small_disk) < 4096
    assert main(["cache", "clear", "--data-dir", str(small_disk)]) == 0
    out = capsys.readouterr().out
    assert "cleared the cache of all sessions" in out and "MB freed" in out
    assert free(small_disk) > 1_000_000


def test_a_reply_is_shown_when_the_turn_cannot_be_saved(small_disk, tiny_model, capsys):
    """Today: the turn was lost and, with --json, the reply was not even printed."""
    args = [
        "chat",
        "--model",
        str(tiny_model),
        "--data-dir",
        str(small_disk),
        "--temp",
        "0",
        "--max-tokens",
        "8",
        "--kv-tokens",
        "4096",
        "--session",
        "s",
    ]
    assert main([*args, "--json", "first"]) == 0
    capsys.readouterr()
    remove_files(small_disk / "kvcache.db")  # nothing the cache could give back
    fill(small_disk, leave=32 * 1024)  # room to open chats.db (its 32 KB index), none to write
    long = "a longer question " * 12
    code = main([*args, "--json", long])
    captured = capsys.readouterr()
    turn = json.loads(captured.out.strip().splitlines()[-1])
    assert (
        code == 2
        and turn["reply"]
        and turn["saved"] is False
        and "disk is full" in turn["save_error"]
    )
    assert captured.err.count("not saved") == 1 and "Traceback" not in captured.err
    code = main([*args, long])  # as text: the reply, then one line on stderr
    captured = capsys.readouterr()
    assert code == 2 and captured.out.strip() == turn["reply"].strip()
    said = [line for line in captured.err.splitlines() if "not saved" in line]
    assert len(said) == 1 and "Traceback" not in captured.err
    (small_disk / "filler").unlink()
    with ChatStore(paths.chats_db_path(small_disk)) as chats:  # what was saved is whole
        assert [m.role for m in chats.messages(chats.get_session("s").id)] == ["user", "assistant"]


def test_on_a_full_disk_the_chat_history_wins_over_the_cache(small_disk, tiny_model, capsys):
    """The disk filled up anyway (by something else): the turn is saved, the cache goes."""
    args = [
        "chat",
        "--model",
        str(tiny_model),
        "--data-dir",
        str(small_disk),
        "--temp",
        "0",
        "--max-tokens",
        "8",
        "--kv-tokens",
        "4096",
        "--session",
        "s",
        "--json",
    ]
    assert main([*args, "first"]) == 0
    capsys.readouterr()
    with DiskStore(small_disk / "kvcache.db", reserve_bytes=0) as store:  # a cache of 2 MB
        for n in range(4):
            store.save_session(f"old{n}", FP, session_pages(n))
    fill(small_disk, leave=32 * 1024)
    code = main([*args, "second"])
    captured = capsys.readouterr()
    assert code == 0 and json.loads(captured.out.strip().splitlines()[-1])["saved"] is True
    said = [line for line in captured.err.splitlines() if "KV cache" in line]
    assert len(said) == 1 and re.fullmatch(
        r"radixchat: the disk is full: the KV cache \(\d\.\d MB\) was deleted "
        r"to save this turn",
        said[0],
    ), said
    with ChatStore(paths.chats_db_path(small_disk)) as chats:
        assert [m.content for m in chats.messages(chats.get_session("s").id)][::2] == [
            "first",
            "second",
        ]


def test_cache_stats_says_what_the_cache_leaves_free(small_disk, capsys):
    with DiskStore(small_disk / "kvcache.db") as store:
        store.save_session("s", FP, session_pages(0))
    assert main(["cache", "stats", "--data-dir", str(small_disk)]) == 0
    line = [line for line in capsys.readouterr().out.splitlines() if line.startswith("disk:")]
    assert line == ["disk: 0.0 GB free; the cache leaves 1.0 GB free (so it stores nothing now)"]
    assert main(["cache", "stats", "--data-dir", str(small_disk), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["disk_reserve_bytes"] == 2**30 and 0 < stats["disk_free_bytes"] < 8 * 2**20
