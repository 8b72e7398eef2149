"""A tool call as the chat shows it: which server's tool, its arguments, and what it gave.

A :class:`ToolCallCard` sits in a reply, where the model made the call. While the call waits
for the user it shows three buttons (Allow, Allow for This Chat, Deny: ``decided`` says
which); then "Running…", then the result: its text (long text folded to its first lines,
the whole in the tooltip-free "Show all" view), its images as pictures, or the error. The
arguments are shown before anything runs, as the server will get them.

A stored reply's cards are made finished (:meth:`ToolCallCard.finished`): the same card,
without buttons.
"""

from __future__ import annotations

import base64
import json

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase, QImage, QPalette, QPixmap
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

ALLOW, ALLOW_CHAT, DENY = "allow", "allow_chat", "deny"
SHOWN_CHARS = 1500  # a result's text beyond this is folded ("Show all")
IMAGE_MAX_PX = 360  # an image result's widest or highest side on screen
STATE_WORDS = {
    "waiting": "Waits for your approval",
    "running": "Running…",
    "ok": "Done",
    "error": "Error",
    "denied": "Denied",
    "cancelled": "Cancelled",
}


def pretty_arguments(arguments: str) -> str:
    """A call's JSON arguments indented for reading (as they came, when not JSON)."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (ValueError, TypeError):
        return arguments


def _mono() -> QFontDatabase:
    return QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)


class ToolCallCard(QFrame):
    """One call: ``server`` › ``tool`` (``name`` when the model's name differs), its
    ``arguments`` (JSON text), then its state and result."""

    decided = Signal(str)  # ALLOW, ALLOW_CHAT or DENY (from the buttons)

    def __init__(
        self,
        name: str,
        arguments: str,
        server: str | None = None,
        tool: str | None = None,
        read_only: bool = False,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.setObjectName("toolCallCard")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Maximum)
        self.state = "waiting"
        self.name, self.arguments = name, arguments
        column = QVBoxLayout(self)
        column.setContentsMargins(10, 8, 10, 8)
        column.setSpacing(4)
        header = QHBoxLayout()
        where = f"{server} › {tool or name}" if server else name
        self.title = QLabel(f"<b>Tool call</b> · {_escape(where)}")
        self.title.setToolTip(
            f"The model called {name!r}"
            + (f": the tool {tool!r} of the MCP server {server!r}" if server else "")
            + (" (read-only, as the server says)" if read_only else "")
        )
        header.addWidget(self.title, 1)
        self.state_label = QLabel()
        self.state_label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        header.addWidget(self.state_label)
        column.addLayout(header)
        self.arguments_view = QLabel(pretty_arguments(arguments) or "(no arguments)")
        self.arguments_view.setObjectName("toolArguments")
        self.arguments_view.setFont(_mono())
        self.arguments_view.setWordWrap(True)
        self.arguments_view.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        column.addWidget(self.arguments_view)
        self.buttons = QWidget()
        row = QHBoxLayout(self.buttons)
        row.setContentsMargins(0, 0, 0, 0)
        self.allow_button = QPushButton("Allow")
        self.allow_button.setToolTip("Run this call once")
        self.allow_chat_button = QPushButton("Allow for This Chat")
        self.allow_chat_button.setToolTip("Run this tool's calls in this chat without asking")
        self.deny_button = QPushButton("Deny")
        self.deny_button.setToolTip("Do not run it: the model is told you said no")
        for button, choice in (
            (self.allow_button, ALLOW),
            (self.allow_chat_button, ALLOW_CHAT),
            (self.deny_button, DENY),
        ):
            button.clicked.connect(lambda _checked=False, c=choice: self._decide(c))
            row.addWidget(button)
        row.addStretch(1)
        column.addWidget(self.buttons)
        self.result_view = QLabel()
        self.result_view.setObjectName("toolResult")
        self.result_view.setFont(_mono())
        self.result_view.setWordWrap(True)
        self.result_view.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.result_view.hide()
        column.addWidget(self.result_view)
        self.show_all = QPushButton("Show All")
        self.show_all.setFlat(True)
        self.show_all.hide()
        self.show_all.clicked.connect(self._show_all)
        column.addWidget(self.show_all, 0, Qt.AlignmentFlag.AlignLeft)
        self.images: list[QLabel] = []
        self._images_at = column.count()
        self._full_text = ""
        self.set_state("waiting")

    @classmethod
    def finished(cls, call: dict, result: dict | None, parent: QWidget | None = None):
        """A stored call's card: ``call`` and ``result`` as a chat keeps them
        (core.chats.tool_steps), no buttons (no result: cancelled)."""
        card = cls(
            call.get("name", ""),
            call.get("arguments", ""),
            call.get("server"),
            call.get("tool"),
            parent=parent,
        )
        result = result or {"status": "cancelled", "parts": []}
        card.set_result(result.get("status", "cancelled"), result.get("parts", []))
        return card

    # ------------------------------------------------------------------ state
    def set_state(self, state: str) -> None:
        """ "waiting" (the buttons), "running", or an end state without a result."""
        self.state = state
        self.state_label.setText(STATE_WORDS.get(state, state))
        self.buttons.setVisible(state == "waiting")

    def set_result(self, status: str, parts: list[dict]) -> None:
        """The call ended: ``status`` ("ok", "error", "denied", "cancelled") and its result's
        parts ({"type": "text", "text"} or {"type": "image", "mime", "data": base64})."""
        self.set_state(status)
        texts = [str(p.get("text", "")) for p in parts if p.get("type") == "text"]
        self._full_text = "\n".join(t for t in texts if t)
        if status == "denied" and not self._full_text:
            self._full_text = "You denied this call: it did not run."
        shown = self._full_text
        if len(shown) > SHOWN_CHARS:
            shown = shown[:SHOWN_CHARS] + "…"
            self.show_all.show()
        self.result_view.setText(shown)
        self.result_view.setVisible(bool(shown))
        if status == "error":
            self.result_view.setForegroundRole(QPalette.ColorRole.BrightText)
        for part in parts:
            if part.get("type") == "image":
                self._add_image(part)

    @property
    def result_text(self) -> str:
        return self._full_text

    # ------------------------------------------------------------------ inside
    def _decide(self, choice: str) -> None:
        if self.state != "waiting":
            return
        self.set_state("denied" if choice == DENY else "running")
        self.decided.emit(choice)

    def _show_all(self) -> None:
        self.result_view.setText(self._full_text)
        self.show_all.hide()

    def _add_image(self, part: dict) -> None:
        label = QLabel()
        label.setObjectName("toolImage")
        image = QImage()
        try:
            data = base64.b64decode(part.get("data", ""), validate=True)
        except ValueError:
            data = b""
        if data and image.loadFromData(data):
            pixmap = QPixmap.fromImage(image)
            if max(pixmap.width(), pixmap.height()) > IMAGE_MAX_PX:
                pixmap = pixmap.scaled(
                    IMAGE_MAX_PX,
                    IMAGE_MAX_PX,
                    Qt.AspectRatioMode.KeepAspectRatio,
                    Qt.TransformationMode.SmoothTransformation,
                )
            label.setPixmap(pixmap)
            label.setToolTip(f"{part.get('mime', 'image')}, {len(data):,} bytes")
        else:
            label.setText(f"[an image ({part.get('mime', '?')}) that could not be read]")
        self.images.append(label)
        self.layout().insertWidget(self._images_at + len(self.images) - 1, label)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
