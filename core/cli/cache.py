"""``radixchat cache stats|verify|clear``: the disk cache of session KV (``kvcache.db``)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

from core import paths
from core.cli.terminal import safe
from core.engine import namespaces
from core.errors import StoreError
from kvcache.sqlite_file import remove_files
from kvcache.store import DiskStore, DiskStoreError, session_row


def run_cache(args) -> int:
    root = paths.data_dir(args.data_dir, create=False)  # looking creates nothing
    path = paths.kv_cache_db_path(root)
    if not path.exists():
        if args.cache_command == "clear":
            print(f"no KV cache at {safe(path)}: nothing to clear (chat history kept)")
        elif getattr(args, "json", False):
            print(json.dumps({"path": str(path), "exists": False}))
        else:
            print(f"no KV cache at {safe(path)} yet")
        return 0
    try:
        with DiskStore(path) as store:
            if args.cache_command == "stats":
                return _stats(store, path, args.json)
            if args.cache_command == "verify":
                report = store.verify()
                print(json.dumps(asdict(report)) if args.json else
                      f"checked {report.pages_checked} pages: {report.bad_pages} bad (dropped), "
                      f"{report.sessions_truncated} sessions cut back, {report.sessions_dropped} dropped, "
                      f"{report.orphans_removed} orphan pages removed — "
                      + ("clean" if report.clean else "repaired"))
                return 0
            freed = store.clear(args.session)
            if args.session is not None:  # a chat's name: the app's chats are rows of its namespace
                freed += store.clear(session_row(args.session, namespaces.APP))
    except DiskStoreError as exc:
        if args.cache_command != "clear" or args.session is not None or getattr(exc, "reason", None) == "locked":
            raise StoreError(str(exc)) from exc  # (a locked cache is in use: never pulled from under it)
        # Clearing everything needs a write (and a VACUUM needs room for a copy): on a full
        # disk, or a file that cannot be opened, delete the files instead; that always works.
        freed = remove_files(path)
    what = f"session {safe(args.session)}" if args.session else "all sessions"
    print(f"cleared the cache of {what}: {freed / paths.MB:.1f} MB freed (chat history kept)")
    return 0


def _stats(store: DiskStore, path, as_json: bool) -> int:
    stats = store.stats()
    sessions = store.sessions()
    free = shutil.disk_usage(path.parent).free
    reserve = free - store.disk_room()  # what the cache leaves free, whatever its budget
    if as_json:  # JSON escapes control characters itself
        print(json.dumps({**asdict(stats), "disk_free_bytes": free, "disk_reserve_bytes": reserve,
                          "sessions_list": [asdict(s) for s in sessions]}))
        return 0
    print(f"{safe(path)}: {stats.sessions} sessions, {stats.prefixes} unnamed prefixes, {stats.pages} pages, "
          f"{stats.bytes / paths.MB:.1f} MB of pages ({stats.file_bytes / paths.MB:.1f} MB on disk, "
          f"budget {stats.budget_bytes / paths.GB:.1f} GB)")
    print(f"saves {stats.saves}, loads {stats.loads}, restored {stats.restored_tokens} tokens "
          f"in {stats.restored_pages} pages, dropped {stats.dropped_pages} bad pages, "
          f"evicted {stats.evicted_sessions} sessions and {stats.evicted_prefixes} prefixes, "
          f"{stats.orphan_pages} orphan pages")
    print(f"written {stats.bytes_written / paths.MB:.1f} MB in {stats.pages_written} pages "
          f"(a stored page is never written again)")
    print(f"disk: {free / paths.GB:.1f} GB free; the cache leaves {reserve / paths.GB:.1f} GB free"
          + ("" if free > reserve else " (so it stores nothing now)"))
    for info in sessions:
        print(f"  {safe(info.name):<32} {info.tokens:>7} tokens {info.pages:>5} pages "
              f"{info.nbytes / paths.MB:9.1f} MB  model {safe(info.fingerprint[:12])}")
    return 0
