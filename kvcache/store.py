"""The disk store of session KV caches: SQLite (``kvcache.db``), apart from the chat history.

A session's cache is a chain of pages. A page holds a run of token ids (a full page, or
fewer at a session's tail), the K/V bytes of every full-attention layer for those tokens,
and, for hybrid models, a snapshot of the sliding-window / recurrent layers' state at the
page's end. The store never looks inside those bytes: the engine serializes arrays.

Pages are content addressed, so a prefix shared by many sessions is stored once::

    key = page_key(fingerprint, parent key, token ids)     # sha256, hex

Inside its cache namespace, that is: a chain's first page has its namespace's root as
parent (:func:`~kvcache.store_format.namespace_root`: None for namespace "", the only
one before namespaces existed), so the same tokens in two namespaces are two chains,
and a walk, a read or a session load in one namespace never reaches another's pages.

A session row names its model fingerprint and the key of its chain's last page (its
head). A prefix row does the same for a chain kept for any request by its tokens alone
(the disk tier: no session name); the engine finds such chains through an in-memory
index of the model's pages (:meth:`DiskStore.index`) and reads them by their keys
(:meth:`DiskStore.read_chain`). Loading follows parent keys from the head back to the first
page, one primary-key lookup each, then reads the K/V of those pages only.

Invariants, each kept by every write transaction (``BEGIN IMMEDIATE``):
- every page is reachable from some session's or prefix's head: a write that orphans
  pages deletes them (save, clear, budget, repair);
- a page is written once: a save skips the keys the store has (``pages_written`` and
  ``bytes_written`` count what was new);
- ``pages`` and ``page_data`` hold the same keys.

Safety: a page is returned only if its fingerprint is the session's, its key is the hash
of its fingerprint, parent and tokens, and its checksum (CRC-32 over tokens, kv and
snapshot) matches. A page that fails is deleted, and every session whose chain runs
through it is cut back to the pages before it (or dropped, when those cannot be
reached), so the engine recomputes them: a damaged cache costs time, never a wrong
answer. Every failure the user can act on is a :class:`DiskStoreError`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from kvcache.sqlite_file import (  # noqa: F401  (MIN_RESERVE...: this module's API too)
    MIN_RESERVE,
    RESERVE_FRACTION,
    SqliteFile,
    disk_room,
)
from kvcache.store_budget import (  # noqa: F401  (MAX_SAVE_BYTES...: this module's API too)
    FIXED_FILE_BYTES,
    MAX_SAVE_BYTES,
    SQLITE_PAGE_SIZE,
    WRITE_FIXED_BYTES,
    checkpoint,
    evict_to,
    pages_limit,
    save_bytes_for,
    shrink_file,
    write_ends,
)
from kvcache.store_format import (  # noqa: F401  (page_key, pack_tokens...: this module's API too)
    LIVE_PAGES,
    MIGRATIONS,
    SCHEMA_VERSION,
    PageData,
    StoredPage,
    chain_keys,
    is_root,
    namespace_root,
    pack_tokens,
    page_checksum,
    page_key,
    page_problem,
    page_rows,
    session_row,
    unpack_tokens,
)
from kvcache.store_reader import ChainLink, ChainPage, IndexedPage, SessionReader
from kvcache.store_repair import (
    VerifyReport,
    cut_back_chains,
    find_bad_pages,
    link_sound,
    walk,
)
from kvcache.store_results import SaveResult, SessionInfo, StoreStats, read_stats

log = logging.getLogger(__name__)

DEFAULT_BUDGET = 10 * 2**30  # bytes of pages on disk
# The disk space the cache leaves free (kvcache.sqlite_file.MIN_RESERVE, RESERVE_FRACTION):
# a save that would eat into it writes nothing, and when something else takes the disk
# past it the cache empties itself and gives the space back (see _enforce_budget).
# No memory map (SQLite's default): a restore reads each page's K/V with an incremental
# blob read, which SQLite serves with read() from the file straight into the result
# (a memory map faults the file in 4 KB at a time instead), measured the faster of the two
# (docs/benchmarks.md).


_HASH_THREADS = min(4, os.cpu_count() or 1)  # checksums of a load, in parallel
_IN_CHUNK = 500  # keys per "key IN (...)" query, under SQLite's variable limit


class DiskStoreError(Exception):
    """The KV cache database cannot be used (corrupt, newer schema, locked, disk full).

    Meant for the user, as one line; the engine then runs without a disk cache."""

    def __str__(self) -> str:
        return " ".join(str(self.args[0] if self.args else "").split())


class DiskStore(SqliteFile):
    """The KV cache database at ``path``, created and migrated on open.

    Use it from one thread at a time (any thread: the engine's writer owns it)."""

    error = DiskStoreError
    migrations = MIGRATIONS
    wordings = {
        "newer": (
            "{path} was written by a newer RadixChat (KV cache schema {version}, "
            "this version knows {known}); running without the disk cache"
        ),
        "foreign": "{path} is a SQLite database but not a RadixChat KV cache; move it aside",
        "locked": "{path} is locked by another RadixChat process",
        "full": (
            "the disk is full: cannot write the KV cache {path} (nothing was written); "
            "free some space or lower the cache budget"
        ),
        "corrupt": "{path} is not a readable KV cache ({text}); move it aside",
        "io": "cannot use the KV cache {path}: {text}",
    }

    def __init__(
        self,
        path: Path,
        *,
        budget_bytes: int = DEFAULT_BUDGET,
        timeout: float = 2.0,
        reserve_bytes: int | None = None,
        save_bytes: int | None = None,
    ):
        self.path = Path(path)
        self.budget_bytes = budget_bytes
        # None: the budget counts the pages' bytes alone; else the files' (see MAX_SAVE_BYTES)
        self.save_bytes = save_bytes
        self.reserve_bytes = reserve_bytes  # None: max(MIN_RESERVE, RESERVE_FRACTION of the disk)
        # Checksums on worker threads (hashlib releases the GIL) while SQLite reads on.
        self._hashers = ThreadPoolExecutor(_HASH_THREADS, thread_name_prefix="kvcache-hash")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="kvcache-read")  # read-ahead
        self.deleted_keys: list[str] = []  # pages this connection deleted (its owner drains it)
        self._connect(timeout, self._setup)

    def _setup(self) -> None:
        if self._user_version() == 0 and not self.db.table_names():
            # Takes effect on a new file only, so before WAL writes its header.
            # (No auto_vacuum: it made reading long blobs three times slower.)
            self.db.execute(f"PRAGMA page_size = {SQLITE_PAGE_SIZE}")
        self.db.enable_wal()
        self.db.execute("PRAGMA synchronous = NORMAL")  # WAL: consistent after a crash
        # Not the zeroing of every freed page some builds default to (Debian's): it made a
        # delete write as much as it deleted, so on a full disk nothing could be evicted.
        self.db.execute("PRAGMA secure_delete = FAST")
        self.db.execute(f"PRAGMA journal_size_limit = {self.save_bytes or 64 * 2**20}")

    def close(self) -> None:
        self._reader.shutdown()
        self._hashers.shutdown()
        if self.db is not None:
            self.db.close()
            self.db = None

    def __enter__(self) -> DiskStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- saving --

    def missing_keys(self, keys: Iterable[str]) -> set[str]:
        """Those of ``keys`` the store does not have (so their K/V must be serialized)."""
        keys = set(keys)
        with self._read():
            return keys - set(self._page_sizes(keys))

    def save_session(
        self,
        session: str,
        fingerprint: str,
        pages: Sequence[PageData],
        namespace: str = "",
        keys: Sequence[str] | None = None,
    ) -> SaveResult:
        """Save a session's whole chain (in ``namespace``; ``session`` is the row's name,
        see :func:`~kvcache.store_format.session_row`), first page first, then enforce the
        budget.

        Pages the store has already (same key) are not rewritten. One transaction: after
        a crash the session is in its old state or its new one. No pages: the session's
        cache is cleared. ``keys``: the pages' keys where the caller computed them already
        (:func:`~kvcache.store_format.chain_keys` of the same pages), else computed here."""
        if not session:
            raise ValueError("a session needs a name")
        return self._save_chain(fingerprint, pages, session, namespace, keys)

    def save_prefix(
        self, fingerprint: str, pages: Sequence[PageData], namespace: str = "", keys=None
    ) -> SaveResult:
        """Keep a chain for any later request of ``namespace`` that starts with its tokens
        (no session): its last page becomes a prefix head, which the budget drops before
        sessions. Pages the store has are not rewritten; one transaction, as for a session."""
        return self._save_chain(fingerprint, pages, None, namespace, keys)

    def _save_chain(
        self,
        fingerprint: str,
        pages: Sequence[PageData],
        session: str | None,
        namespace: str = "",
        keys: Sequence[str] | None = None,
    ) -> SaveResult:
        if keys is None:
            keys = chain_keys(fingerprint, [page.tokens for page in pages], namespace)
        elif len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys for {len(pages)} pages")
        parents = [namespace_root(namespace), *keys[:-1]]
        missing = self.missing_keys(keys)
        to_write = [
            (key, parent, page)
            for key, parent, page in zip(keys, parents, pages)
            if key in missing and page.kv is not None
        ]
        rows = self._hashers.map(lambda job: page_rows(fingerprint, *job), to_write)
        prepared = {key: row for (key, _, _), row in zip(to_write, rows)}  # before the lock
        # A chain longer than one write: its first parts go in as prefixes (their heads new
        # pages, so no prefix row of before is touched), the last part replaces those rows
        # by the chain's own.
        ends = write_ends(keys, prepared, self.save_bytes)
        parts: list[SaveResult] = []
        scaffold: list[str] = []  # the heads of the prefix rows the first parts made
        for end in ends[:-1]:
            part = self._write_chain(
                fingerprint, pages[:end], keys[:end], parents, prepared, None, scaffold, saves=0
            )
            parts.append(part)
            if part.pages < end:  # the disk gave way, or pages went missing: keep what is in
                break
            scaffold.append(keys[end - 1])
        else:
            parts.append(
                self._write_chain(fingerprint, pages, keys, parents, prepared, session, scaffold)
            )
        last = parts[-1]
        return SaveResult(
            session=session,
            head=last.head,
            pages=last.pages,
            tokens=last.tokens,
            pages_written=sum(part.pages_written for part in parts),
            bytes_written=sum(part.bytes_written for part in parts),
            evicted_sessions=tuple(name for part in parts for name in part.evicted_sessions),
            gave_way=any(part.gave_way for part in parts),
        )

    def _write_chain(
        self,
        fingerprint: str,
        pages: Sequence[PageData],
        keys: Sequence[str],
        parents: Sequence[str | None],
        prepared: dict[str, tuple[dict, dict]],
        session: str | None,
        scaffold: Sequence[str],
        saves: int = 1,
    ) -> SaveResult:
        """One write transaction of :meth:`_save_chain`: the chain's pages the store lacks,
        its session or prefix row, then the budget. ``scaffold``: the prefix rows its earlier
        parts made, which the budget spares; the chain's last part drops them."""
        now = time.time()
        room = self.disk_room()
        with self._transaction():
            stored = self._page_sizes(keys)
            chain: list[str] = []
            tokens = nbytes = 0
            new_pages: list[dict] = []
            new_data: list[dict] = []
            for key, parent, page in zip(keys, parents, pages):
                if key not in stored:
                    if key not in prepared:
                        if page.kv is None:
                            break  # gone since missing_keys and not serialized: keep the prefix
                        prepared[key] = page_rows(fingerprint, key, parent, page)
                    page_row, data_row = prepared[key]
                    new_pages.append({**page_row, "last_used": now})
                    new_data.append(data_row)
                    stored[key] = page_row["nbytes"]
                chain.append(key)
                tokens += len(page.tokens)
                nbytes += stored[key]
            # New pages pass through the write-ahead log before the file: twice their size.
            gives_way = 2 * sum(row["nbytes"] for row in new_pages) > room
            if gives_way:  # the disk is nearly full: write nothing, the session keeps its old chain
                chain, new_pages, new_data, tokens = [], [], [], 0
                log.info(
                    "not saving %s: the disk is nearly full",
                    f"the cache of {session}" if session is not None else "a cached prefix",
                )
            self.db["pages"].insert_all(new_pages, ignore=True)
            self.db["page_data"].insert_all(new_data, ignore=True)
            self._touch_pages(chain, now)
            if session is None:
                if chain:
                    self._keep_prefix(fingerprint, chain[-1], tokens, now)
            else:
                if not gives_way:
                    self.db.execute("DELETE FROM sessions WHERE name = ?", [session])
                if chain:
                    self.db["sessions"].insert(
                        {
                            "name": session,
                            "fingerprint": fingerprint,
                            "head": chain[-1],
                            "tokens": tokens,
                            "pages": len(chain),
                            "nbytes": nbytes,
                            "updated_at": now,
                            "last_used": now,
                        }
                    )
            spared = [*scaffold, chain[-1]] if chain else list(scaffold)
            if chain and saves:  # the last part: the chain's own row reaches the first parts'
                self.db.conn.executemany(
                    "DELETE FROM prefixes WHERE head = ?",
                    [[head] for head in scaffold if head != chain[-1]],
                )
                spared = []
            written = sum(row["nbytes"] for row in new_pages)
            self._count(saves=saves, pages_written=len(new_pages), bytes_written=written)
            _freed, evicted = self._enforce_budget(room, fingerprint, spared)
        self._checkpoint(shrink=room < 0)
        return SaveResult(
            session=session,
            head=chain[-1] if chain else None,
            pages=len(chain),
            tokens=tokens,
            pages_written=len(new_pages),
            bytes_written=written,
            evicted_sessions=tuple(evicted),
            gave_way=gives_way,
        )

    # -- loading --

    def load_session(self, session: str, fingerprint: str, namespace: str = "") -> list[StoredPage]:
        """The session's chain, first page first, every page checked.

        Stops at the first bad or missing page: bad pages are deleted (so the engine
        recomputes them) and the good prefix is returned. Another model's session, or a
        chain of another namespace: []."""
        with self.read_session(session, fingerprint, namespace=namespace) as reader:
            return list(reader.pages())

    @contextmanager
    def read_session(
        self, session: str, fingerprint: str, record: bool = True, namespace: str = ""
    ) -> Iterator[SessionReader]:
        """The session's chain inside one read transaction: ``reader.chain`` (tokens and
        snapshot flags, no K/V) to decide what to use, then ``reader.pages(n)`` streams
        the K/V of the first ``n`` pages. Another model's or an unknown session, or one
        whose chain does not start at ``namespace``'s root: an empty chain. On leaving,
        :meth:`record_reading` marks the pages handed out used and deletes bad pages found
        on the way (their sessions cut back before them); with ``record=False`` the caller
        does that later, on a thread that may wait for the write lock (the engine's restore
        hands it to its writer thread)."""
        reader = SessionReader(self, [], set())
        found = False
        with self._read():
            row = self.db.execute(
                "SELECT fingerprint, head FROM sessions WHERE name = ?", [session]
            ).fetchone()
            if row is not None and row[0] == fingerprint:
                found = True
                links, broken = walk(self.db, row[1], fingerprint)
                if broken is not None:  # the pages before the break cannot be reached
                    reader.suspects.add(broken)
                    links = []
                if links and links[-1].parent != namespace_root(namespace):
                    found, links = False, []  # another namespace's chain: not this one's to read
                reader = SessionReader(self, links[::-1], reader.suspects)
            try:
                yield reader
            finally:
                reader.close()
        if found and record:
            self.record_reading(session, fingerprint, reader.used, reader.suspects)

    @contextmanager
    def read_chain(
        self, fingerprint: str, keys: Sequence[str], namespace: str = ""
    ) -> Iterator[SessionReader]:
        """The chain of ``keys`` (first page first, as a caller found it by a prompt's
        tokens in its index) inside one read transaction, as :meth:`read_session` gives a
        session's. Each page is checked as a walk checks it (this fingerprint, the previous
        key as parent -- the first page's is ``namespace``'s root --, a key that is the hash
        of both and the tokens); the chain stops before the first that fails. Keys no longer
        stored end up in ``reader.missing``."""
        with self._read():
            links: list[ChainLink] = []
            missing: set[str] = set()
            parent = namespace_root(namespace)
            for key in keys:
                row = self.db.execute(
                    "SELECT parent, fingerprint, tokens, nbytes, checksum FROM pages WHERE key = ?",
                    [key],
                ).fetchone()
                if row is None:
                    missing.add(key)
                    break
                if row[0] != parent or not link_sound(key, row, fingerprint):
                    break
                links.append(ChainLink(key, row[0], row[2], row[3], row[4]))
                parent = key
            reader = SessionReader(self, links, set())
            reader.missing = missing
            try:
                yield reader
            finally:
                reader.close()

    def index(self, fingerprint: str) -> list[IndexedPage]:
        """Every stored page of ``fingerprint`` (metadata only, no K/V read): what the disk
        tier holds in memory to find a prompt's pages by its tokens."""
        rows = self._rows(
            "SELECT p.key, p.parent, p.tokens, d.snapshot IS NOT NULL FROM pages AS p "
            "JOIN page_data AS d ON d.key = p.key WHERE p.fingerprint = ?",
            [fingerprint],
        )
        return [IndexedPage(key, parent, tokens, bool(snap)) for key, parent, tokens, snap in rows]

    def record_reading(
        self,
        session: str | None,
        fingerprint: str,
        used: Sequence[ChainPage],
        suspects: set[str],
        head: tuple[str, int] | None = None,
    ) -> None:
        """After a read: mark ``used`` pages (and the session) used, repair ``suspects``.
        ``head`` (key, tokens up to it): the end of what a read by tokens used, kept as a
        prefix so the budget counts it as used now. A reading that used no page and found
        none bad writes nothing."""
        if not (used or suspects):
            return
        now = time.time()
        with self._transaction():
            if suspects:
                self._repair(suspects)
            if head is not None and self._page_sizes([head[0]]):
                self._keep_prefix(fingerprint, head[0], head[1], now)
            self.db.execute(
                "UPDATE sessions SET last_used = ? WHERE name = ? AND fingerprint = ?",
                [now, session, fingerprint],
            )
            self._touch_pages([page.key for page in used], now)
            self._count(
                loads=1,
                restored_pages=len(used),
                restored_tokens=sum(len(page.tokens) for page in used),
            )

    def read_ahead(self, link: ChainLink, has_snapshot: bool) -> Future:
        """Start reading one page of a chain (a :class:`SessionReader` reads ahead so):
        a future of the page's K/V, its snapshot and a future of its checksum, or of None
        when the page has no data row. Inside a read transaction (the reads share the
        store's connection on its read-ahead thread, one at a time)."""
        return self._reader.submit(self._fetch, link, has_snapshot)

    def _fetch(self, link: ChainLink, has_snapshot: bool):
        """One page's K/V and snapshot, and its checksum being computed (reader thread),
        or None when the page has no data row."""
        if has_snapshot:
            row = self.db.execute(
                "SELECT kv, snapshot FROM page_data WHERE key = ?", [link.key]
            ).fetchone()
            if row is None:
                return None
            kv, snapshot = row
        else:
            row = self.db.execute(
                "SELECT rowid FROM page_data WHERE key = ?", [link.key]
            ).fetchone()
            if row is None:
                return None
            # Straight into the bytes object: SQLite reads the overflow pages from the file
            # into the caller's buffer (no copy through its page cache, no second copy).
            with self.db.conn.blobopen("page_data", "kv", row[0], readonly=True) as blob:
                kv, snapshot = blob.read(), None
        return kv, snapshot, self._hashers.submit(page_checksum, link.tokens, kv, snapshot)

    # -- inspecting --

    def session(self, name: str) -> SessionInfo | None:
        """One session's row (a primary-key lookup), or None."""
        rows = self._rows(
            "SELECT name, fingerprint, tokens, pages, nbytes, updated_at, last_used "
            "FROM sessions WHERE name = ?",
            [name],
        )
        return SessionInfo(*rows[0]) if rows else None

    def sessions(self) -> list[SessionInfo]:
        """All sessions, most recently used first."""
        rows = self._rows(
            "SELECT name, fingerprint, tokens, pages, nbytes, updated_at, last_used "
            "FROM sessions ORDER BY last_used DESC, name"
        )
        return [SessionInfo(*row) for row in rows]

    def stats(self) -> StoreStats:
        with self._read():
            return read_stats(self.db, self.path, self.budget_bytes)

    # -- deleting --

    def clear(self, session: str | None = None) -> int:
        """Delete one session's cache (its row and the pages no other session reaches;
        later saves reuse their space), or everything (the file shrinks). Returns the
        bytes of pages freed."""
        with self._transaction():
            if session is None:
                freed = self.db.execute("SELECT coalesce(sum(nbytes), 0) FROM pages").fetchone()[0]
                for table in ("sessions", "prefixes", "pages", "page_data"):
                    self.db.execute(f"DELETE FROM {table}")
            else:
                self.db.execute("DELETE FROM sessions WHERE name = ?", [session])
                freed = self._delete_orphans()[1]
        if session is None:
            with self._errors():
                self.db.execute("VACUUM")
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # busy readers postpone it
        return freed

    def enforce_budget(self, fingerprint: str | None = None) -> int:
        """Delete orphan pages, then chains (and the pages only they reached) until the
        pages fit the budget, and the disk keeps its reserve: other models' chains before
        ``fingerprint``'s (the loaded one), prefixes before sessions, least recently used
        first. Returns the bytes freed."""
        room = self.disk_room()
        with self._transaction():
            freed, _evicted = self._enforce_budget(room, fingerprint)
        self._checkpoint(shrink=room < 0)
        if room >= 0 and self.save_bytes is not None:
            shrink_file(self.db, self.budget_bytes, self.save_bytes, room)
        return freed

    def pages_limit(self) -> int:
        """What the pages may count (see :meth:`_enforce_budget`): the budget, or for a store
        that keeps its files within it (``save_bytes``), the budget less room for one write
        in the log and in the file, and for SQLite's own tables."""
        if self.save_bytes is None:
            return self.budget_bytes
        return pages_limit(self.budget_bytes, self.save_bytes)

    def disk_room(self) -> int:
        """The bytes the cache may still take from its disk: the free space less the reserve
        (``reserve_bytes``, or max(MIN_RESERVE, RESERVE_FRACTION of the disk)). Negative
        when the disk is already past the reserve: then the cache gives back that much."""
        try:
            return disk_room(self.path, self.reserve_bytes)
        except OSError as exc:
            raise DiskStoreError(f"cannot see the free space beside {self.path}: {exc}") from exc

    # -- internals (inside a transaction) --

    def _enforce_budget(
        self, room: int, fingerprint: str | None = None, spared: Sequence[str] = ()
    ) -> tuple[int, list[str]]:
        """Evict down to the budget (:meth:`pages_limit`; with ``save_bytes``, each page
        counts one SQLite page more than its bytes). When the disk is already past its
        reserve (``room < 0``: something else filled it), evict everything instead (``spared``,
        the prefix rows of a chain being written, included; else they stay): deleted
        rows only give space back to the disk through a VACUUM, which needs room for what is
        left, so only an empty cache can be sure to return it (see :meth:`_checkpoint`)."""
        if room < 0:
            evicted = [
                name for (name,) in self.db.execute("SELECT name FROM sessions ORDER BY name")
            ]
            freed = self.db.execute("SELECT coalesce(sum(nbytes), 0) FROM pages").fetchone()[0]
            self.deleted_keys.extend(key for (key,) in self.db.execute("SELECT key FROM pages"))
            for table in ("sessions", "prefixes", "pages", "page_data"):
                self.db.execute(f"DELETE FROM {table}")
            if evicted:
                self._count(evicted_sessions=len(evicted))
                log.warning(
                    "the disk is past the KV cache's reserve: %d cached sessions evicted "
                    "to give the space back",
                    len(evicted),
                )
            return freed, evicted
        overhead = 0 if self.save_bytes is None else SQLITE_PAGE_SIZE
        freed, evicted, prefixes = evict_to(
            self.db, self.pages_limit(), overhead, fingerprint, spared, self._delete_orphans
        )
        self._count(evicted_sessions=len(evicted), evicted_prefixes=prefixes)
        return freed, evicted

    def verify(self) -> VerifyReport:
        """Re-hash every page; delete the bad ones, cut each session back to the pages
        before its first bad one (dropping it if that leaves none or its chain cannot be
        walked), delete orphans (:mod:`kvcache.store_repair`)."""
        with self._read():  # no write lock while hashing everything
            checked, suspects = find_bad_pages(self.db)
        with self._transaction():
            bad, truncated, dropped, orphans = self._repair(suspects)
            strays = self.db.execute(
                "DELETE FROM page_data WHERE key NOT IN (SELECT key FROM pages)"
            ).rowcount
        return VerifyReport(checked, bad, truncated, dropped, orphans + strays)

    def _repair(self, suspects: set[str]) -> tuple[int, int, int, int]:
        """Inside a transaction: chains cut back before the bad pages among ``suspects``,
        those pages and the orphans deleted. (bad pages, chains truncated, dropped, orphans)"""
        cut = cut_back_chains(self.db, suspects, self._keep_prefix)
        self._delete_pages(cut.bad)
        self._count(dropped_pages=len(cut.bad))
        return len(cut.bad), cut.truncated, cut.dropped, self._delete_orphans()[0]

    def _keep_prefix(self, fingerprint: str, head: str, tokens: int, now: float) -> None:
        self.db.execute(
            "INSERT INTO prefixes (head, fingerprint, tokens, last_used) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (head) DO UPDATE SET last_used = excluded.last_used",
            [head, fingerprint, tokens, now],
        )

    def _delete_orphans(self) -> tuple[int, int]:
        """Delete the pages no session reaches; returns (pages, bytes)."""
        orphans = self.db.execute(
            f"{LIVE_PAGES} SELECT key, nbytes FROM pages WHERE key NOT IN live"
        ).fetchall()
        self._delete_pages([key for key, _ in orphans])
        return len(orphans), sum(nbytes for _, nbytes in orphans)

    def _delete_pages(self, keys: list[str]) -> None:
        for table in ("pages", "page_data"):
            self.db.conn.executemany(f"DELETE FROM {table} WHERE key = ?", [[k] for k in keys])
        self.db.conn.executemany("DELETE FROM prefixes WHERE head = ?", [[k] for k in keys])
        self.deleted_keys.extend(keys)

    def _page_sizes(self, keys: Iterable[str]) -> dict[str, int]:
        """nbytes of those of ``keys`` that are stored."""
        keys = list(dict.fromkeys(keys))
        sizes: dict[str, int] = {}
        for start in range(0, len(keys), _IN_CHUNK):
            chunk = keys[start : start + _IN_CHUNK]
            sizes.update(
                self.db.execute(
                    f"SELECT key, nbytes FROM pages WHERE key IN ({', '.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
            )
        return sizes

    def _touch_pages(self, keys: list[str], now: float) -> None:
        self.db.conn.executemany(
            "UPDATE pages SET last_used = ? WHERE key = ?", [[now, key] for key in keys]
        )

    def _count(self, **amounts: int) -> None:
        self.db.conn.executemany(
            "INSERT INTO counters (name, value) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
            [[name, amount] for name, amount in amounts.items() if amount],
        )

    def _rows(self, sql: str, params: list | None = None) -> list[tuple]:
        with self._errors():
            return self.db.execute(sql, params or []).fetchall()

    def _checkpoint(self, shrink: bool = False) -> None:
        checkpoint(self.db, self.path, self.save_bytes, shrink)
