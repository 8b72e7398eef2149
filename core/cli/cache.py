"""``radixchat cache stats|verify|clear``: the disk caches of session KV (``clear`` of
everything also deletes the files made from models at load, ``core.models.derived``, and
the API's stored responses and conversations, ``responses.db``).

The data folder holds the single machine's store (``kvcache.db``) and, beside it, one store
per rank of each group that ran from it (``kvcache-rank1of2.db``: :mod:`core.distributed`).
``stats`` and ``verify`` go through all of them, ``clear`` clears all of them, or one
(``--store single`` / ``--store rank1of2``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from core import paths
from core.cli.terminal import safe
from core.distributed.shard import rank_cache_stores
from core.engine import namespaces
from core.errors import StoreError, UserError
from core.models import derived
from kvcache.sqlite_file import remove_files
from kvcache.store import DiskStore, DiskStoreError, session_row

SINGLE = "single"  # the name of the single machine's store (``--store``)


def run_cache(args) -> int:
    root = paths.data_dir(args.data_dir, create=False)  # looking creates nothing
    single = paths.kv_cache_db_path(root)
    ranks = rank_cache_stores(root)
    chosen = getattr(args, "store", None)
    if chosen is not None:
        named = {SINGLE: single, **dict(ranks)}
        if chosen not in named:
            raise UserError(
                f"no KV cache store {safe(chosen)!r} in {safe(root)}: there are {', '.join(named)}"
            )
        ranks = [(chosen, named[chosen])] if chosen != SINGLE else []
        if chosen != SINGLE:
            single = None
    as_json = getattr(args, "json", False)
    if args.cache_command == "clear":
        if single is not None:
            _clear(single, args.session, "")
        for name, path in ranks:
            _clear(path, args.session, f"{name}: ")
        if args.session is None and chosen is None:  # the files made from models go too
            _clear_responses(paths.responses_db_path(root))
            made = derived.derived_files(root)
            if made:
                freed = derived.remove(made)
                print(
                    f"deleted {len(made)} files made from models at load: "
                    f"{freed / paths.MB:.1f} MB freed (the next load makes them again)"
                )
        return 0
    if single is None or not single.exists():
        report = {"path": str(single), "exists": False}
        if not as_json:
            print(f"no KV cache at {safe(single)} yet")
    else:
        with _open(single) as store:
            report = (
                _stats(store, single, as_json)
                if args.cache_command == "stats"
                else _verify(store, as_json)
            )
    rank_reports = []
    for name, path in ranks:
        with _open(path) as store:
            if args.cache_command == "stats":
                stats = store.stats()
                rank_reports.append({"store": name, "path": str(path), **asdict(stats)})
                if not as_json:
                    print(
                        f"{name} ({safe(path.name)}): {stats.sessions} sessions, "
                        f"{stats.prefixes} unnamed prefixes, {stats.pages} pages, "
                        f"{stats.bytes / paths.MB:.1f} MB of pages "
                        f"({stats.file_bytes / paths.MB:.1f} MB on disk)"
                    )
            else:
                if not as_json:
                    print(f"{name}: ", end="")
                rank_reports.append({"store": name, "path": str(path), **_verify(store, as_json)})
    if as_json:
        print(json.dumps({**report, "rank_stores": rank_reports}))
    return 0


def _open(path: Path) -> DiskStore:
    try:
        return DiskStore(path)
    except DiskStoreError as exc:
        raise StoreError(str(exc)) from exc


def _clear(path: Path, session: str | None, label: str) -> None:
    if not path.exists():
        print(f"{label}no KV cache at {safe(path)}: nothing to clear (chat history kept)")
        return
    try:
        with DiskStore(path) as store:
            freed = store.clear(session)
            if session is not None:  # a chat's name: the app's chats are rows of its namespace
                freed += store.clear(session_row(session, namespaces.APP))
    except DiskStoreError as exc:
        if session is not None or getattr(exc, "reason", None) == "locked":
            # (a locked cache is in use: never pulled from under it)
            raise StoreError(str(exc)) from exc
        # Clearing everything needs a write (and a VACUUM needs room for a copy): on a full
        # disk, or a file that cannot be opened, delete the files instead; that always works.
        freed = remove_files(path)
    what = f"session {safe(session)}" if session else "all sessions"
    print(
        f"{label}cleared the cache of {what}: {freed / paths.MB:.1f} MB freed (chat history kept)"
    )


def _clear_responses(path: Path) -> None:
    """Delete the API's stored responses and conversations (on a full disk, or a file that
    cannot be opened, their files: that always works)."""
    from core.api.responses_store import ResponseStore  # the API's store: imported on use

    if not path.exists():
        return
    store = ResponseStore(path)
    try:
        cleared = store.clear()
    except StoreError as exc:
        if getattr(exc, "reason", None) == "locked":  # in use: never pulled from under it
            raise
        store.close()
        freed = remove_files(path)
        print(f"deleted the stored responses ({safe(path)}): {freed / paths.MB:.1f} MB freed")
        return
    finally:
        store.close()
    print(
        f"deleted {cleared.responses} stored responses and {cleared.conversations} "
        f"conversations: {cleared.bytes / paths.MB:.1f} MB freed"
    )


def _verify(store: DiskStore, as_json: bool) -> dict:
    result = store.verify()
    if not as_json:
        print(
            f"checked {result.pages_checked} pages: {result.bad_pages} bad (dropped), "
            f"{result.sessions_truncated} sessions cut back, {result.sessions_dropped} dropped, "
            f"{result.orphans_removed} orphan pages removed — "
            + ("clean" if result.clean else "repaired")
        )
    return {**asdict(result), "clean": result.clean}


def _stats(store: DiskStore, path, as_json: bool) -> dict:
    stats = store.stats()
    sessions = store.sessions()
    free = shutil.disk_usage(path.parent).free
    reserve = free - store.disk_room()  # what the cache leaves free, whatever its budget
    if as_json:  # JSON escapes control characters itself
        return {
            **asdict(stats),
            "disk_free_bytes": free,
            "disk_reserve_bytes": reserve,
            "sessions_list": [asdict(s) for s in sessions],
        }
    print(
        f"{safe(path)}: {stats.sessions} sessions, {stats.prefixes} unnamed prefixes, "
        f"{stats.pages} pages, {stats.bytes / paths.MB:.1f} MB of pages "
        f"({stats.file_bytes / paths.MB:.1f} MB on disk, budget "
        f"{stats.budget_bytes / paths.GB:.1f} GB)"
    )
    print(
        f"saves {stats.saves}, loads {stats.loads}, restored {stats.restored_tokens} tokens "
        f"in {stats.restored_pages} pages, dropped {stats.dropped_pages} bad pages, "
        f"evicted {stats.evicted_sessions} sessions and {stats.evicted_prefixes} prefixes, "
        f"{stats.orphan_pages} orphan pages"
    )
    print(
        f"written {stats.bytes_written / paths.MB:.1f} MB in {stats.pages_written} pages "
        f"(a stored page is never written again)"
    )
    print(
        f"disk: {free / paths.GB:.1f} GB free; the cache leaves {reserve / paths.GB:.1f} GB free"
        + ("" if free > reserve else " (so it stores nothing now)")
    )
    for info in sessions:
        print(
            f"  {safe(info.name):<32} {info.tokens:>7} tokens {info.pages:>5} pages "
            f"{info.nbytes / paths.MB:9.1f} MB  model {safe(info.fingerprint[:12])}"
        )
    return {}
