"""Where RadixChat keeps its files.

The data folder is, in order: an explicit ``--data-dir``, ``$RADIXCHAT_HOME``, or the
platform's user data folder (``platformdirs``). It holds ``models/``, ``chats.db`` and
(later) the cache database.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "RadixChat"


def data_dir(override: str | os.PathLike | None = None) -> Path:
    """The data folder, created if missing."""
    if override:
        path = Path(override).expanduser()
    elif os.environ.get("RADIXCHAT_HOME"):
        path = Path(os.environ["RADIXCHAT_HOME"]).expanduser()
    else:
        path = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir(root: Path) -> Path:
    path = root / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def chats_db_path(root: Path) -> Path:
    return root / "chats.db"
