"""Where RadixChat keeps its files.

The data folder is, in order: an explicit ``--data-dir``, ``$RADIXCHAT_HOME``, or the
platform's user data folder (``platformdirs``). It holds ``models/``, ``chats.db`` and
(later) the cache database.
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
        raise UserError(f"the data folder {safe_path(path)} is a file, not a folder; give another --data-dir")
    if not create:
        if not path.is_dir():
            raise UserError(f"there is no data folder at {safe_path(path)}")
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a parent that is a file, no permission, a read-only disk
        raise UserError(f"cannot create the data folder {safe_path(path)}: {exc.strerror or exc}") from exc
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
