"""The app's look: names, icon and style, set once on the QApplication (the app, the
screenshot and ``bench gui`` all use it)."""

from __future__ import annotations

import sys

from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from resources import resource_path


def apply_look(app: QApplication) -> None:
    """Native on macOS (system font, dark mode from the system); Fusion elsewhere, which
    follows the desktop's colour scheme in Qt 6.5+."""
    app.setApplicationName("RadixChat")
    app.setOrganizationName("RadixChat")
    app.setApplicationDisplayName("RadixChat")
    icon = resource_path("RadixChat.png")
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    if sys.platform != "darwin":
        app.setStyle("Fusion")
