"""The SQLite plumbing both stores share: versions, migrations, transactions, errors."""

import sqlite3

import pytest

from kvcache.sqlite_file import SqliteFile


class NotesError(Exception):
    """The test store's own error, as StoreError and DiskStoreError are the real ones'."""


def _create(db):
    db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL)")


class Notes(SqliteFile):
    error = NotesError
    migrations = [_create]
    wordings = {
        "newer": "{path}: schema {version} > {known}",
        "foreign": "{path}: not notes",
        "locked": "{path}: locked",
        "corrupt": "{path}: corrupt ({text})",
        "io": "{path}: io ({text})",
    }

    def __init__(self, path, timeout=0.1):
        self.path = path
        self._connect(timeout, self.db_setup)

    def db_setup(self):
        self.db.enable_wal()


def test_migrates_once_and_reopens(tmp_path):
    notes = Notes(tmp_path / "n.db")
    assert notes._user_version() == 1 == notes.schema_version
    with notes._transaction():
        notes.db.execute("INSERT INTO notes (text) VALUES ('kept')")
    notes.db.close()
    again = Notes(tmp_path / "n.db")
    assert [r["text"] for r in again.db.query("SELECT text FROM notes")] == ["kept"]


def test_a_failed_transaction_leaves_nothing(tmp_path):
    notes = Notes(tmp_path / "n.db")
    with pytest.raises(sqlite3.IntegrityError):
        with notes._transaction():
            notes.db.execute("INSERT INTO notes (text) VALUES ('half')")
            notes.db.execute("INSERT INTO notes (text) VALUES (NULL)")
    assert list(notes.db.query("SELECT * FROM notes")) == []
    with notes._transaction():  # no transaction left open
        notes.db.execute("INSERT INTO notes (text) VALUES ('after')")


def test_newer_and_foreign_files_are_refused_untouched(tmp_path):
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as conn:
        conn.execute("PRAGMA user_version = 7")
    with pytest.raises(NotesError, match=r"newer.db: schema 7 > 1"):
        Notes(newer)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE other (x)")
    with pytest.raises(NotesError, match="not notes"):
        Notes(foreign)
    with sqlite3.connect(foreign) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0


def test_user_errors_get_the_stores_words(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(NotesError, match=r"garbage.db: corrupt \(file is not a database\)"):
        Notes(garbage)
    notes = Notes(tmp_path / "n.db")
    holder = sqlite3.connect(tmp_path / "n.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        # BEGIN IMMEDIATE itself waits out the busy timeout and fails
        with pytest.raises(NotesError, match="n.db: locked"), notes._transaction():
            notes.db.execute("INSERT INTO notes (text) VALUES ('never')")
    finally:
        holder.execute("ROLLBACK")


def test_disk_full_without_its_own_wording_reads_as_io(tmp_path):
    notes = Notes(tmp_path / "n.db")
    with pytest.raises(NotesError, match=r"io \(database or disk is full\)"):
        with notes._errors():
            raise sqlite3.OperationalError("database or disk is full")
    with pytest.raises(sqlite3.ProgrammingError):  # a bug stays a bug
        with notes._errors():
            raise sqlite3.ProgrammingError("wrong number of bindings")
