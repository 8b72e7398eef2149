"""A reasoning model's thinking, folded above its reply.

``ThinkingFold`` is one line while folded (the default): an arrow and "Thinking…" while the
thinking streams, "Thought for N tokens" once the reply is done (N: the engine's count of
the reply's thinking tokens; "Thought" for a reply stored without one). Clicked, it opens
to the thinking's text, dim and selectable, as plain text; clicked again, it folds. The
text is laid out only while open, so a long thinking costs a folded reply nothing.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget


class ThinkingFold(QWidget):
    """The thinking of one reply (see the module docstring); hidden while it has none."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.text = ""
        self.tokens = 0
        self.streaming = False
        self.button = QToolButton()
        self.button.setObjectName("thinkingButton")
        self.button.setCheckable(True)  # checked: open
        self.button.setAutoRaise(True)
        self.button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.button.setArrowType(Qt.ArrowType.RightArrow)
        self.button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.button.setToolTip("Show or hide the model's thinking before this reply")
        self.button.toggled.connect(self._on_toggled)
        self.body = QLabel()
        self.body.setObjectName("thinkingText")
        self.body.setTextFormat(Qt.TextFormat.PlainText)
        self.body.setWordWrap(True)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.body.setForegroundRole(QPalette.ColorRole.PlaceholderText)  # dim
        self.body.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.body.setContentsMargins(18, 0, 4, 4)  # under the title, past the arrow
        self.body.hide()
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addWidget(self.button, 0, Qt.AlignmentFlag.AlignLeft)
        column.addWidget(self.body)
        self._dim_title()
        self._show()

    @property
    def expanded(self) -> bool:
        return self.button.isChecked()

    def set_expanded(self, expanded: bool) -> None:
        self.button.setChecked(expanded)

    def set_thinking(self, text: str, tokens: int = 0, streaming: bool = False) -> None:
        """The thinking so far (``streaming``) or the whole of it, with its token count."""
        self.text, self.tokens, self.streaming = text, tokens, streaming
        self._show()

    @property
    def title(self) -> str:
        if self.streaming:
            return "Thinking…"
        if self.tokens:
            return f"Thought for {self.tokens:,} token{'s' if self.tokens != 1 else ''}"
        return "Thought"

    def _show(self) -> None:
        self.setVisible(bool(self.text) or self.streaming)
        self.button.setText(self.title)
        if self.expanded:
            self.body.setText(self.text)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt override)
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._dim_title()

    def _dim_title(self) -> None:
        """The title in the theme's dim text colour, as the thinking itself."""
        palette = self.button.palette()
        dim = self.palette().color(QPalette.ColorRole.PlaceholderText)
        palette.setColor(QPalette.ColorRole.ButtonText, dim)
        self.button.setPalette(palette)

    def _on_toggled(self, opened: bool) -> None:
        self.button.setArrowType(Qt.ArrowType.DownArrow if opened else Qt.ArrowType.RightArrow)
        if opened:
            self.body.setText(self.text)
        self.body.setVisible(opened)
