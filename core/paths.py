"""Where RadixChat keeps its files.

The data folder is, in order: an explicit ``--data-dir``, ``$RADIXCHAT_HOME``, or the
platform's user data folder (``platformdirs``). It holds ``models/``, ``chats.db``,
``responses.db`` (the API's stored responses), ``mcp.json`` (the MCP tool servers),
``logs/`` (their stderr) and the disk cache of session KV
(``kvcache.db``, with SQLite's ``-wal`` and ``-shm`` files beside it).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from core.errors import UserError

APP_NAME = "RadixChat"


def data_dir(override: str | os.PathLike | None = None, *, create: bool = True) -> Path:
    """The data folder, created if missing (``create=False``: it must exist already, for
    commands that only look). A path that is a file, or a folder that cannot be made,
    is a :class:`~core.errors.UserError`."""
    if override:
        path = Path(override).expanduser()
    elif os.environ.get("RADIXCHAT_HOME"):
        path = Path(os.environ["RADIXCHAT_HOME"]).expanduser()
    else:
        path = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    if path.exists() and not path.is_dir():
        raise UserError(
            f"the data folder {safe_path(path)} is a file, not a folder; give another --data-dir"
        )
    if not create:
        if not path.is_dir():
            raise UserError(f"there is no data folder at {safe_path(path)}")
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a parent that is a file, no permission, a read-only disk
        raise UserError(
            f"cannot create the data folder {safe_path(path)}: {exc.strerror or exc}"
        ) from exc
    return path


def safe_path(path: Path) -> str:
    """A path for a message: bytes that were not UTF-8 shown escaped."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def models_dir(root: Path) -> Path:
    path = root / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def chats_db_path(root: Path) -> Path:
    return root / "chats.db"


def mcp_config_file(root: Path) -> Path:
    """The MCP servers (``mcp.json``, the format LM Studio and Claude Desktop read)."""
    return Path(root) / "mcp.json"


def logs_dir(root: Path) -> Path:
    """Logs the user can open (an MCP server's stderr: ``mcp-NAME.log``)."""
    return Path(root) / "logs"


def responses_db_path(root: Path) -> Path:
    """The Responses API's stored responses (``previous_response_id``), beside the chats."""
    return root / "responses.db"


# One unit for every size the user reads or types: GB = 2**30 bytes (MB = 2**20). Binary,
# because the memory panel shows RAM that way (as memory tools do) and the disk cache's row
# sits among those figures: "10 GB" typed in Preferences, the panel's "of 10.0 GB" and
# `radixchat cache stats`' "budget 10.0 GB" are the same number of bytes.
MB, GB = 2**20, 2**30


def gb_to_bytes(gb: float) -> int:
    """A size typed in GB (``GB`` bytes each) in bytes."""
    return round(gb * GB)


def default_disk_budget() -> int:
    """The disk cache's budget in bytes when none is chosen (``kvcache.store.DEFAULT_BUDGET``:
    the front ends reach kvcache through core)."""
    from kvcache.store import DEFAULT_BUDGET  # imported on use: sqlite-utils is slow to import

    return DEFAULT_BUDGET


STORED_RESPONSES_MAX = 256 * MB  # the stored responses' share of the disk budget, at most


def stored_responses_budget(disk_budget: int) -> int:
    """The stored responses' share (``core.api.responses_store``) of the data folder's disk
    budget: an eighth of it, at most ``STORED_RESPONSES_MAX``."""
    return min(STORED_RESPONSES_MAX, disk_budget // 8)


# What the stored responses' files take on disk for each byte their budget counts (the
# UTF-8 bytes of what is stored): SQLite's tables and indexes, the write-ahead log, free
# pages inside the file. Measured 1.7 at most in `radixchat bench soak`.
RESPONSES_FILE_FACTOR = 2


def stored_responses_bytes(root: Path, disk_budget: int) -> int:
    """What the disk cache leaves to the stored responses in the data folder ``root``: room
    for their files at their share (``RESPONSES_FILE_FACTOR``), or what the files take where
    that is more (written before the share existed). Kept from the first start,
    ``responses.db`` or not: the server creates it after the model's load measured the room,
    and the folder must hold its budget from then on."""
    share = RESPONSES_FILE_FACTOR * stored_responses_budget(disk_budget)
    return max(database_bytes(responses_db_path(root)), share)


def database_bytes(path: Path) -> int:
    """What a SQLite database takes on disk: its file and its write-ahead log."""
    size = 0
    for side in (path, path.with_name(path.name + "-wal")):
        try:
            size += side.stat().st_size
        except OSError:
            continue
    return size


KV_CACHE_DB = "kvcache.db"  # the one place this name is typed


def kv_cache_db_path(root: Path) -> Path:
    """The disk cache of session KV (``kvcache.store.DiskStore``) in the data folder ``root``."""
    return Path(root) / KV_CACHE_DB


def kv_cache_db_files(root: Path) -> tuple[Path, Path, Path]:
    """The disk cache's database and SQLite's write-ahead log and shared-memory files."""
    path = kv_cache_db_path(root)
    return path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")
