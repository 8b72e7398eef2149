"""The message box under the chat: Enter sends, Shift+Enter adds a line, Esc stops a reply
(or takes back a waiting message, or cancels an edit); Send and Stop buttons; a banner while
the last message is edited, a line for a message that waits for the chat's reply to end.

The box stays editable while a reply streams: what is typed then is never lost, and Enter
sends it once the reply ends (the window queues it)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)


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
        self.waiting = QLabel()  # the message sent while this chat's reply streams
        self.waiting.setObjectName("waitingMessage")
        self.waiting.setWordWrap(True)
        self.waiting.hide()
        self.input = QPlainTextEdit()
        self.input.setObjectName("messageInput")
        self.input.setPlaceholderText("Message (Enter sends, Shift+Enter adds a line)")
        self.input.setFixedHeight(self.input.fontMetrics().lineSpacing() * 4 + 14)
        self.input.installEventFilter(self)
        self.input.setTabChangesFocus(True)  # Tab moves on, as in any form
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
        column.addWidget(self.waiting)
        column.addLayout(row)
        self.set_state(ready=False, generating=False)

    def text(self) -> str:
        return self.input.toPlainText()

    def set_text(self, text: str) -> None:
        self.input.setPlainText(text)
        self.input.moveCursor(self.input.textCursor().MoveOperation.End)

    def set_state(self, ready: bool, generating: bool) -> None:
        """``ready``: a model is loaded and a chat open; ``generating``: the chat's reply runs
        or its message waits (Stop works). The box stays editable, and Send works while a
        reply runs: the window queues what is sent."""
        was_ready = self._ready
        self._ready, self._generating = ready, generating
        self.send_button.setEnabled(ready)
        self.send_button.setToolTip("Sends once the reply ends" if generating else "")
        self.stop_button.setEnabled(generating)
        # the first time it can send, where nothing else has the focus: never taken from
        # the chat list or another control the user is on
        if ready and not was_ready and QApplication.focusWidget() is None:
            self.input.setFocus()

    def show_waiting(self, text: str | None) -> None:
        """Show ``text`` as the message waiting for this chat's reply (None: none waits)."""
        if text is None:
            self.waiting.hide()
            return
        line = " ".join(text.split())
        line = line if len(line) <= 120 else line[:119] + "…"
        self.waiting.setText(f"Waiting to send: “{line}” (Esc takes it back)")
        self.waiting.show()

    def take_back(self, text: str) -> None:
        """A waiting or unsent message back in the box, before what was typed since."""
        typed = self.text()
        self.set_text(text if not typed.strip() else f"{text}\n{typed}")

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
        if text and self._ready:
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
