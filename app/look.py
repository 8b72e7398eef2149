"""The app's look: names, icon and style, set once on the QApplication (the app, the
screenshot and ``bench gui`` all use it)."""

from __future__ import annotations

import sys

from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from resources import resource_path

# A focus ring that can be seen (issue 45.2: Fusion's was a faint line): the widget with the
# keyboard's focus framed in the palette's highlight colour, 2 px. Set on the main window,
# so its dialogs have it too.
FOCUS_RING = """
QPlainTextEdit, QListWidget, QListView, QTreeView, QTableView {
    border: 1px solid palette(mid);
    padding: 1px;
}
QPlainTextEdit:focus, QListWidget:focus, QListView:focus, QTreeView:focus, QTableView:focus {
    border: 2px solid palette(highlight);
    padding: 0px;
}
QLineEdit:focus, QAbstractSpinBox:focus, QComboBox:focus {
    border: 2px solid palette(highlight);
    border-radius: 3px;
}
QPushButton:focus, QToolButton:focus {
    border: 2px solid palette(highlight);
    border-radius: 4px;
    background: palette(button);
    padding: 3px 10px;
}
QCheckBox:focus, QRadioButton:focus {
    outline: none;
    border: 2px solid palette(highlight);
    border-radius: 3px;
}
"""


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
