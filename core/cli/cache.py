"""``radixchat cache stats|verify|clear``: the disk cache of session KV (``kvcache.db``)."""

from __future__ import annotations

import json
from dataclasses import asdict

from core import paths
from core.errors import StoreError
from kvcache.store import DiskStore, DiskStoreError


def run_cache(args) -> int:
    path = paths.kv_cache_db_path(paths.data_dir(args.data_dir))
    try:
        with DiskStore(path) as store:
            if args.cache_command == "stats":
                stats = store.stats()
                if args.json:
                    print(json.dumps({**asdict(stats), "sessions_list": [asdict(s) for s in store.sessions()]}))
                    return 0
                print(f"{path}: {stats.sessions} sessions, {stats.prefixes} unnamed prefixes, {stats.pages} pages, "
                      f"{stats.bytes / paths.MB:.1f} MB of pages ({stats.file_bytes / paths.MB:.1f} MB on disk, "
                      f"budget {stats.budget_bytes / paths.GB:.1f} GB)")
                print(f"saves {stats.saves}, loads {stats.loads}, restored {stats.restored_tokens} tokens "
                      f"in {stats.restored_pages} pages, dropped {stats.dropped_pages} bad pages, "
                      f"evicted {stats.evicted_sessions} sessions and {stats.evicted_prefixes} prefixes, "
                      f"{stats.orphan_pages} orphan pages")
                print(f"written {stats.bytes_written / paths.MB:.1f} MB in {stats.pages_written} pages "
                      f"(a stored page is never written again)")
                for info in store.sessions():
                    print(f"  {info.name:<32} {info.tokens:>7} tokens {info.pages:>5} pages "
                          f"{info.nbytes / paths.MB:9.1f} MB  model {info.fingerprint[:12]}")
                return 0
            if args.cache_command == "verify":
                report = store.verify()
                print(json.dumps(asdict(report)) if args.json else
                      f"checked {report.pages_checked} pages: {report.bad_pages} bad (dropped), "
                      f"{report.sessions_truncated} sessions cut back, {report.sessions_dropped} dropped, "
                      f"{report.orphans_removed} orphan pages removed — "
                      + ("clean" if report.clean else "repaired"))
                return 0
            freed = store.clear(args.session)
            what = f"session {args.session}" if args.session else "all sessions"
            print(f"cleared the cache of {what}: {freed / paths.MB:.1f} MB freed (chat history kept)")
            return 0
    except DiskStoreError as exc:
        raise StoreError(str(exc)) from exc
