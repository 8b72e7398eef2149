"""The message box under the chat: Enter sends, Shift+Enter adds a line, Esc stops a reply
(or cancels an edit); Send and Stop buttons; a banner while the last message is edited."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget


class Composer(QWidget):
    sendRequested = Signal(str)  # the stripped text
    stopRequested = Signal()
    editCancelled = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.editing = False
        self._ready = False
        self._generating = False

        self.banner = QLabel(
            "Editing your last message: sending replaces it and its reply. Esc cancels."
        )
        self.banner.setObjectName("editBanner")
        self.banner.setWordWrap(True)
        self.banner.hide()
        self.input = QPlainTextEdit()
        self.input.setObjectName("messageInput")
        self.input.setPlaceholderText("Message (Enter sends, Shift+Enter adds a line)")
        self.input.setFixedHeight(self.input.fontMetrics().lineSpacing() * 4 + 14)
        self.input.installEventFilter(self)
        self.send_button, self.stop_button = QPushButton("Send"), QPushButton("Stop")
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.stopRequested)
        self.stop_button.setToolTip("Stop the reply (Esc)")

        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch()
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.input, 1)
        row.addLayout(buttons)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(4)
        column.addWidget(self.banner)
        column.addLayout(row)
        self.set_state(ready=False, generating=False)

    def text(self) -> str:
        return self.input.toPlainText()

    def set_text(self, text: str) -> None:
        self.input.setPlainText(text)
        self.input.moveCursor(self.input.textCursor().MoveOperation.End)

    def set_state(self, ready: bool, generating: bool) -> None:
        """``ready``: a model is loaded and nothing is running; ``generating``: Stop works."""
        self._ready, self._generating = ready, generating
        self.input.setReadOnly(generating)
        self.send_button.setEnabled(ready and not generating)
        self.stop_button.setEnabled(generating)
        if ready and not generating:
            self.input.setFocus()

    def start_edit(self, text: str) -> None:
        self.editing = True
        self.banner.show()
        self.set_text(text)
        self.input.setFocus()

    def cancel_edit(self) -> None:
        if self.editing:
            self.editing = False
            self.banner.hide()
            self.input.clear()
            self.editCancelled.emit()

    def finish_edit(self) -> None:
        self.editing = False
        self.banner.hide()

    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if text and self._ready and not self._generating:
            self.sendRequested.emit(text)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.input and event.type() == QEvent.Type.KeyPress:
            if (
                event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
                and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier
            ):
                self.send()
                return True
            if event.key() == Qt.Key.Key_Escape:
                if self._generating:
                    self.stopRequested.emit()
                else:
                    self.cancel_edit()
                return True
        return super().eventFilter(watched, event)
