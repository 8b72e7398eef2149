"""``radixchat`` with no command: the desktop app. Settings, the chat store and the engine
bridge are opened here, the main window shown, and all closed again when it quits."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtWidgets import QApplication, QMessageBox

from app.bridge import EngineBridge
from app.look import apply_look
from app.main_window import MainWindow
from app.settings_dialogs import AppSettings
from core.chats.store import ChatStore
from core.errors import StoreError
from core.paths import chats_db_path


def run_app(
    data_root: Path,
    model_spec: str,
    data_root_chosen: bool = True,
    kv_bits: int | None = None,
    kv_group_size: int | None = None,
) -> int:
    """Open the main window while the model loads; returns the exit code. The data folder
    of the app's settings applies unless ``--data-dir`` or ``$RADIXCHAT_HOME`` chose one;
    ``kv_bits`` and ``kv_group_size``, the command line's (None: not given), go over the
    Preferences'."""
    app = QApplication.instance() or QApplication(sys.argv)
    apply_look(app)
    settings = AppSettings()
    if not data_root_chosen and settings.data_dir:
        try:
            Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
            data_root = Path(settings.data_dir)
        except OSError as exc:  # the default folder still works: say so and go on
            QMessageBox.warning(
                None,
                "RadixChat",
                f"The data folder in Preferences cannot be used, so "
                f"RadixChat uses {data_root}.\n\n{exc.strerror or exc}: {settings.data_dir}",
            )
    fallback = None  # the last-used model may be gone: then the default, said so
    if model_spec == "default" and settings.last_model and settings.last_model != "default":
        model_spec, fallback = settings.last_model, "default"
    try:
        store = ChatStore(chats_db_path(data_root))
    except StoreError as exc:  # also printed by the CLI, but a double-clicked app has no terminal
        QMessageBox.critical(None, "RadixChat", f"RadixChat cannot open its chats.\n\n{exc}")
        raise
    config = settings.engine_config(kv_bits, kv_group_size)
    bridge = EngineBridge(data_root, model_spec, config=config)
    window = MainWindow(bridge, store, settings, fallback_model=fallback)
    window.show()
    bridge.start()
    try:
        app.exec()
    finally:
        # a group serving the API stops in order (its ranks flush)
        window.server.group_bridge.shutdown()
        bridge.shutdown()
        store.close()
    return 0
