"""The chat database's schema: numbered migrations, ``PRAGMA user_version`` = how many were
applied (:class:`~kvcache.sqlite_file.SqliteFile` runs them on open)."""

from __future__ import annotations

from sqlite_utils import Database


def _migration_1(db: Database) -> None:
    db.execute(
        """CREATE TABLE sessions (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            title TEXT,
            system_prompt TEXT,
            model TEXT,
            settings TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )"""
    )
    db.execute(
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL,
            stats TEXT,
            created_at REAL NOT NULL
        )"""
    )
    db.execute("CREATE UNIQUE INDEX messages_session_seq ON messages(session_id, seq)")


def _migration_2(db: Database) -> None:
    """A reply's thinking (a reasoning model's), kept beside its text."""
    db.execute("ALTER TABLE messages ADD COLUMN reasoning TEXT")


def _migration_3(db: Database) -> None:
    """Branches: a chat made from another (its parent, how many messages it took), and a
    regenerated reply's versions (JSON: {"chosen": i, "replies": [...]})."""
    db.execute(
        "ALTER TABLE sessions ADD COLUMN parent_id INTEGER "
        "REFERENCES sessions(id) ON DELETE SET NULL"
    )
    db.execute("ALTER TABLE sessions ADD COLUMN fork_seq INTEGER")
    db.execute("ALTER TABLE messages ADD COLUMN versions TEXT")


def _migration_4(db: Database) -> None:
    """A reply's tool loop (JSON: its steps, each the model's calls and their results;
    NULL for a plain reply): see :mod:`core.chats.tool_steps`."""
    db.execute("ALTER TABLE messages ADD COLUMN tool_steps TEXT")


MIGRATIONS = [_migration_1, _migration_2, _migration_3, _migration_4]
SCHEMA_VERSION = len(MIGRATIONS)
