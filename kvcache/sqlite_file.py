"""What RadixChat's SQLite files share: the chat history (``core.chats.store``), the KV cache
(``kvcache.store``) and the API's stored responses (``core.api.responses_store``).

One connection through sqlite-utils, usable from one thread at a time (any thread); the
schema versioned by ``PRAGMA user_version`` and migrated one step per transaction; read
and write transactions; and the database failures a user can act on (locked, disk full,
not a database, written by a newer version) turned into the store's own one-line error;
the disk space a store leaves free (:func:`disk_room`), and setting a damaged file aside.
It lives in ``kvcache`` because ``kvcache`` may not import ``core``.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sqlite_utils import Database

Migration = Callable[[Database], None]

# The disk space a store that can give way (the KV cache, the stored responses) leaves
# free, whatever its budget: the chat history (and everything else on the disk) comes
# first. A write that would eat into it writes nothing.
MIN_RESERVE = 2**30
RESERVE_FRACTION = 0.05


def disk_room(path: Path, reserve_bytes: int | None = None) -> int:
    """The bytes a store at ``path`` may still take from its disk: the free space less the
    reserve (``reserve_bytes``, or max(MIN_RESERVE, RESERVE_FRACTION of the disk)). Negative
    when the disk is already past the reserve. Raises OSError when the disk cannot be seen."""
    usage = shutil.disk_usage(Path(path).parent)
    if reserve_bytes is None:
        reserve_bytes = max(MIN_RESERVE, int(usage.total * RESERVE_FRACTION))
    return usage.free - reserve_bytes


class SqliteFile:
    """A store kept in one SQLite file. A subclass names its ``error`` class, its
    ``migrations`` (step n brings ``user_version`` from n - 1 to n) and the wording of
    its ``wordings``, templates over ``{path}``, ``{text}`` (SQLite's words),
    ``{version}`` (the file's schema) and ``{known}`` (this version's)::

        newer     the file's schema is newer than this version knows
        foreign   a SQLite file with tables, but not this kind of store
        locked    another process holds the write lock past the busy timeout
        full      the disk is full (optional: "io" words it otherwise)
        corrupt   not a database, or a malformed one
        io        cannot open, read or write the file
    """

    error: type[Exception] = RuntimeError
    migrations: Sequence[Migration] = ()
    wordings: dict[str, str] = {}

    path: Path
    db: Database | None = None

    @property
    def schema_version(self) -> int:
        return len(self.migrations)

    def _connect(self, timeout: float, setup: Callable[[], None]) -> None:
        """Open ``self.path``: refuse a newer schema before anything is written, run
        ``setup`` (pragmas), then the pending migrations. On failure nothing stays open."""
        conn = None
        try:
            with self._errors():
                conn = sqlite3.connect(str(self.path), timeout=timeout, check_same_thread=False)
                self.db = Database(conn, execute_plugins=False)
                self._check_version(self._user_version())
                setup()
                self._migrate()
        except BaseException:
            if conn is not None:
                conn.close()
            self.db = None
            raise

    def _wording(self, kind: str, text: str = "", version: int = 0) -> str:
        return self.wordings[kind].format(
            path=self.path, text=text, version=version, known=self.schema_version
        )

    def _user_version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def _check_version(self, version: int) -> None:
        if version > self.schema_version:
            error = self.error(self._wording("newer", version=version))
            error.reason = "newer"
            raise error

    def _migrate(self) -> None:
        """Apply each pending migration in its own transaction."""
        for version, migration in enumerate(self.migrations, start=1):
            if self._user_version() >= version:
                continue  # no write lock needed: opens while another process writes
            with self._transaction():
                current = self._user_version()  # re-read: another process may have migrated
                self._check_version(current)
                if current >= version:
                    continue
                if current == 0 and self.db.table_names():
                    error = self.error(self._wording("foreign"))
                    error.reason = "foreign"
                    raise error
                migration(self.db)
                self.db.execute(f"PRAGMA user_version = {version}")

    @contextmanager
    def _read(self) -> Iterator[None]:
        """One read transaction: a consistent snapshot that blocks no writer (WAL)."""
        with self._errors():
            self.db.execute("BEGIN")
            try:
                yield
            finally:
                self.db.rollback()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction, committed whole or rolled back whole. ``BEGIN
        IMMEDIATE`` takes the write lock up front (waiting up to the busy timeout), so a
        read-then-write never fails half way on a lock upgrade."""
        with self._errors():
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self.db.execute("COMMIT")
            except BaseException:
                self.db.rollback()
                raise

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn the database failures a user can act on into ``self.error``."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            kind = _failure_kind(str(exc), has_full="full" in self.wordings)
            if kind is None:
                raise  # a bug, not something the user can fix
            error = self.error(self._wording(kind, text=str(exc)))
            error.reason = kind  # which of the wordings: callers may act on it (set aside...)
            raise error from exc


SIDE_FILES = ("", "-wal", "-shm", "-journal")  # a database and what SQLite keeps beside it


def remove_files(path: Path) -> int:
    """Delete the database at ``path`` and its side files; returns the bytes freed. Needs
    no free space (unlike a DELETE or a VACUUM): what a full disk still allows."""
    freed = 0
    for suffix in SIDE_FILES:
        side = path.with_name(path.name + suffix)
        try:
            size = side.stat().st_size
            side.unlink()
        except FileNotFoundError:
            continue
        freed += size
    return freed


def set_aside(path: Path) -> Path:
    """Rename the database at ``path`` (and its side files) to ``NAME.damaged-N``, the first
    N free, so a new one can be made in its place; returns the new name. A rename needs
    no free space and keeps the old file for whoever wants to look at it."""
    n = 1
    while any(path.with_name(f"{path.name}.damaged-{n}{suffix}").exists() for suffix in SIDE_FILES):
        n += 1
    target = path.with_name(f"{path.name}.damaged-{n}")
    for suffix in SIDE_FILES:
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    return target


def _failure_kind(text: str, has_full: bool) -> str | None:
    if "locked" in text or "busy" in text:
        return "locked"
    if has_full and "full" in text:
        return "full"
    if "not a database" in text or "malformed" in text:
        return "corrupt"
    if any(s in text for s in ("disk", "readonly", "unable to open", "I/O")):
        return "io"
    return None
