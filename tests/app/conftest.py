"""The ``open_window`` fixture: the real main window over a given engine, shut down after."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtCore import QSettings  # noqa: E402

from app.bridge import EngineBridge  # noqa: E402
from app.main_window import MainWindow  # noqa: E402
from app.settings_dialogs import AppSettings  # noqa: E402
from core.chats.store import ChatStore  # noqa: E402
from core.engine.engine import Engine  # noqa: E402
from core.paths import chats_db_path  # noqa: E402
from tests.faults.conftest import small_disk  # noqa: E402,F401  (test_main_window_faults: a full disk)


@pytest.fixture
def open_window(qtbot, tmp_path):
    """open_window(spec=..., engine=...) -> (window, bridge, store); shut down afterwards.
    ``server_port``: None for the settings' port (0: any free port).
    The data folder is tmp_path, so a second window in one test finds the first's chats."""
    opened = []

    def open_(
        spec: str | None = None,
        engine: Engine | None = None,
        server_port: int | None = 0,
        fallback_model: str | None = None,
    ):
        bridge = EngineBridge(tmp_path, spec, engine=engine)
        store = ChatStore(chats_db_path(tmp_path))
        settings = AppSettings(
            QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
        )
        window = MainWindow(
            bridge, store, settings, server_port=server_port, fallback_model=fallback_model
        )
        qtbot.addWidget(window)
        window.show()
        opened.append((window, bridge, store))
        return window, bridge, store

    def close(window, bridge, store) -> None:
        if (window, bridge, store) in opened:
            opened.remove((window, bridge, store))
            window.close()
            bridge.shutdown()
            store.close()

    open_.close = close
    yield open_
    for window, bridge, store in list(opened):
        close(window, bridge, store)
