"""File › Export Chat… and Import Chat…: a chat out as Markdown or JSON (with each reply's
model and settings), a JSON chat in as a new chat (``core.chats.transfer`` does the work)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QStandardPaths, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFileDialog, QWidget

from core.chats import transfer
from core.chats.store import ChatStore
from core.errors import UserError

MARKDOWN_FILTER, JSON_FILTER = "Markdown (*.md)", "JSON (*.json)"


def file_stem(title: str) -> str:
    """A chat title as a file name: letters, digits, spaces, dashes."""
    return re.sub(r"[^\w\- ]+", "", title).strip()[:60] or "chat"


class ChatFiles(QObject):
    """The two actions, over the chat ``current()`` returns (a session id, or None);
    ``imported(session_id)`` after an import; ``say(text)`` for the status line."""

    imported = Signal(int)

    def __init__(
        self,
        parent: QWidget,
        store: ChatStore,
        current: Callable[[], int | None],
        say: Callable[..., None],
    ):
        super().__init__(parent)
        self.parent_widget, self.store, self.current, self.say = parent, store, current, say
        self.export_action = QAction("Export Chat…", parent)
        self.export_action.setShortcut(QKeySequence("Ctrl+E"))
        self.export_action.setToolTip("Save this chat as Markdown or JSON")
        self.export_action.triggered.connect(lambda _checked=False: self.export_chat())
        self.import_action = QAction("Import Chat…", parent)
        self.import_action.setShortcut(QKeySequence.StandardKey.Open)
        self.import_action.setToolTip("Open a chat exported as JSON, as a new chat")
        self.import_action.triggered.connect(lambda _checked=False: self.import_chat())

    def export_chat(self) -> None:
        session_id = self.current()
        session = self.store.get_session_by_id(session_id) if session_id is not None else None
        if session is None:
            return
        path, chosen = self._ask_export_path(file_stem(session.title or session.name))
        if not path:
            return
        kind = "json" if chosen == JSON_FILTER or path.lower().endswith(".json") else "markdown"
        suffix = ".json" if kind == "json" else ".md"
        target = Path(path) if Path(path).suffix else Path(path).with_suffix(suffix)
        try:
            transfer.write_export(self.store, session.id, target, kind)
        except UserError as exc:
            self.say(f"Could not export the chat: {exc}")
            return
        self.say(f"Exported “{session.title or session.name}” to {target}", 8000)

    def import_chat(self) -> None:
        path = self._ask_import_path()
        if not path:
            return
        try:
            done = transfer.import_chat(self.store, transfer.read_export(Path(path)))
        except UserError as exc:
            self.say(f"Could not import {Path(path).name}: {exc}")
            return
        self.imported.emit(done.session.id)
        self.say(
            f"Imported “{done.session.title or done.session.name}”: {done.messages} messages; "
            "its cache is built on its first reply",
            8000,
        )

    # -- file dialogs (tests replace these) --

    def _ask_export_path(self, stem: str) -> tuple[str, str]:
        folder = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
        return QFileDialog.getSaveFileName(
            self.parent_widget,
            "Export chat",
            str(Path(folder) / f"{stem}.md"),
            f"{MARKDOWN_FILTER};;{JSON_FILTER}",
        )

    def _ask_import_path(self) -> str:
        path, _ = QFileDialog.getOpenFileName(
            self.parent_widget, "Import chat", "", f"{JSON_FILTER};;All files (*)"
        )
        return path
