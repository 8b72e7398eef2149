"""The main window (plain for now): a transcript, an input box, Send and Stop, and a
"Serve API" switch that runs the OpenAI-compatible server inside the app."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QSignalBlocker, Qt
from PySide6.QtGui import QAction, QCloseEvent, QFont, QTextBlockFormat, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (QApplication, QHBoxLayout, QLabel, QMainWindow, QMessageBox, QPlainTextEdit,
                               QPushButton, QTextBrowser, QVBoxLayout, QWidget)

from app.bridge import EngineBridge
from core.chat_store import ChatStore
from core.errors import StoreError, UserError
from core.paths import chats_db_path


class MainWindow(QMainWindow):
    """One chat per app start; each finished turn is stored in the chat store.

    ``server_port``: where "Serve API" listens on 127.0.0.1 (0: any free port)."""

    def __init__(self, bridge: EngineBridge, store: ChatStore, parent: QWidget | None = None,
                 server_port: int = 8000):
        super().__init__(parent)
        self.bridge, self.store = bridge, store
        self.server_port = server_port
        self.session = store.create_session()
        self.messages: list[tuple[str, str]] = []  # (role, content) of the finished turns
        self.sampling: dict = {"temperature": 0.7, "max_tokens": 512}  # a settings panel comes later
        self.model_name = ""
        self._pending = ""  # the user message being answered
        self.error_box: QMessageBox | None = None

        self.setWindowTitle("RadixChat")
        self.resize(760, 600)
        self.transcript = QTextBrowser()
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Message (Enter sends, Shift+Enter adds a line)")
        self.input.setFixedHeight(self.input.fontMetrics().lineSpacing() * 4 + 12)
        self.input.installEventFilter(self)
        self.send_button, self.stop_button = QPushButton("Send"), QPushButton("Stop")
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.bridge.cancel)
        buttons = QVBoxLayout()
        for button in (self.send_button, self.stop_button):
            buttons.addWidget(button)
        buttons.addStretch()
        row = QHBoxLayout()
        row.addWidget(self.input, 1)
        row.addLayout(buttons)
        central = QWidget()
        column = QVBoxLayout(central)
        column.setContentsMargins(10, 10, 10, 6)
        column.addWidget(self.transcript, 1)
        column.addLayout(row)
        self.setCentralWidget(central)

        self.serve_action = QAction("Serve API", self)
        self.serve_action.setCheckable(True)
        self.serve_action.setToolTip("Serve the OpenAI-compatible API on 127.0.0.1"
                                     + (f":{server_port}" if server_port else ""))
        self.serve_action.toggled.connect(self._on_serve_toggled)
        self.menuBar().addMenu("&Server").addAction(self.serve_action)
        toolbar = self.addToolBar("Server")
        toolbar.setObjectName("serverToolBar")
        toolbar.setMovable(False)
        toolbar.addAction(self.serve_action)
        self.server_label = QLabel()
        self.server_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.server_label.hide()
        self.statusBar().addPermanentWidget(self.server_label)

        self._set_busy(True, generating=False)
        self.statusBar().showMessage("Loading the model…")

        bridge.loadProgress.connect(self._on_load_progress)
        bridge.modelReady.connect(self._on_ready)
        bridge.loadFailed.connect(self._on_load_failed)
        bridge.token.connect(self._append)
        bridge.finished.connect(self._on_finished)
        bridge.failed.connect(self._on_failed)
        bridge.serverStopped.connect(self._on_server_stopped)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if (watched is self.input and event.type() == QEvent.Type.KeyPress
                and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
                and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier):
            self.send()
            return True
        return super().eventFilter(watched, event)

    def closeEvent(self, event: QCloseEvent) -> None:
        self.serve_action.setChecked(False)  # stops the API server (the app's exit waits for it)
        super().closeEvent(event)

    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or self.bridge.busy or not self.model_name:
            return
        # first: a bad setting raises here, before the window changes (events arrive queued)
        self.bridge.send(self.messages + [("user", text)], self.sampling, session=self.session.name)
        self._pending = text
        self.input.clear()
        self._start_turn("You", text)
        self._start_turn("Assistant", "")
        self._set_busy(True, generating=True)
        self.statusBar().showMessage(f"{self.model_name} · generating…")

    # -- slots --

    def _on_load_progress(self, stage: str, fraction: float) -> None:
        percent = f" {fraction:.0%}" if fraction >= 0 else ""
        self.statusBar().showMessage(f"Loading the model: {stage}{percent}")

    def _on_ready(self, name: str) -> None:
        self.model_name = name
        self.statusBar().showMessage(name)
        self._set_busy(False)

    def _on_load_failed(self, message: str) -> None:
        self.statusBar().showMessage(f"Could not load the model: {message}")
        self.error_box = QMessageBox(QMessageBox.Icon.Warning, "RadixChat", "Could not load the model.",
                                     QMessageBox.StandardButton.Ok, self)
        self.error_box.setInformativeText(message)
        self.error_box.open()

    def _on_finished(self, text: str, stats: dict) -> None:
        self.messages += [("user", self._pending), ("assistant", text)]
        stopped = " · stopped" if stats["finish_reason"] == "cancelled" else ""
        self.statusBar().showMessage(
            f"{self.model_name} · {stats['completion_tokens']} tokens · {stats['decode_tps']:.1f} tok/s"
            f" · TTFT {stats['ttft_s']:.2f} s · prompt {stats['prompt_tokens']} tokens,"
            f" {stats['cached_tokens'] + stats['restored_tokens']} cached{stopped}")
        self._set_busy(False)
        try:
            self.store.add_turn(self.session.id, self._pending, text, stats)
        except StoreError as exc:  # the chat goes on in memory
            self.statusBar().showMessage(f"Could not save the chat: {exc}")

    def _on_failed(self, message: str) -> None:
        self._start_turn("Error", message)
        self.statusBar().showMessage(f"{self.model_name} · error: {message}")
        if not self.input.toPlainText():
            self.input.setPlainText(self._pending)  # nothing lost: the message can be sent again
        self._set_busy(False)

    def _on_serve_toggled(self, on: bool) -> None:
        if not on:
            self.serve_action.setEnabled(False)  # until the port is free again
            self.server_label.setText("API: stopping…")
            self.bridge.stop_server()
            return
        try:
            address = self.bridge.start_server(self.server_port)
        except UserError as exc:
            with QSignalBlocker(self.serve_action):
                self.serve_action.setChecked(False)
            self.statusBar().showMessage(f"Could not start the API server: {exc}")
            return
        self.server_label.setText(f"API: {address}")
        self.server_label.show()

    def _on_server_stopped(self) -> None:
        self.server_label.hide()
        self.serve_action.setEnabled(True)
        self.statusBar().showMessage("API server stopped", 5000)

    # -- helpers --

    def _set_busy(self, busy: bool, generating: bool = False) -> None:
        self.input.setEnabled(not busy)
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(generating)
        if not busy:
            self.input.setFocus()

    def _start_turn(self, speaker: str, text: str) -> None:
        cursor = QTextCursor(self.transcript.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        if not self.transcript.document().isEmpty():
            spacing = QTextBlockFormat()
            spacing.setTopMargin(10)
            cursor.insertBlock(spacing)
        bold = QTextCharFormat()
        bold.setFontWeight(QFont.Weight.Bold)
        cursor.insertText(f"{speaker}:", bold)
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        self._append(text)

    def _append(self, text: str) -> None:
        bar = self.transcript.verticalScrollBar()
        follow = bar.value() == bar.maximum()
        cursor = QTextCursor(self.transcript.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text, QTextCharFormat())
        if follow:
            bar.setValue(bar.maximum())


def run_app(data_root: Path, model_spec: str) -> int:
    """Open the main window while the model loads; returns the exit code."""
    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("RadixChat")
    store = ChatStore(chats_db_path(data_root))
    bridge = EngineBridge(data_root, model_spec)
    window = MainWindow(bridge, store)
    window.show()
    bridge.start()
    try:
        app.exec()
    finally:
        bridge.shutdown()
        store.close()
    return 0
