"""The chat view: one session's messages as a scrolling column, rendered as Markdown
(``app.markdown``).

Above the messages a notice may stand (``set_notice``: one line about the chat as a whole,
e.g. that the loaded model is a base model): said once, above every chat, not per message.

Each message is a ``MessageWidget``: a role header ("You", "Assistant", "Error"), a
read-only ``MarkdownView`` whose height follows its document at the current width (user
messages sit on a tinted bubble that shrinks to short text, replies span the column), and
a footer of flat tool buttons plus an optional dim note. A reasoning model's reply has its
thinking folded between its header and its body (``app.thinking_fold``: collapsed, "Thought
for N tokens", opened with a click; ``append_thinking`` streams it). The view owns one
Regenerate and one Edit button and moves them onto the last message, when it is a reply,
and the last user message.

Streaming stays cheap: ``append_reply`` only collects pieces; a single-shot timer
re-renders the streaming message at most every ``STREAM_RENDER_MS`` (longer when a render
gets slow, so rendering never takes more than a quarter of the event loop), and no other
message is touched. A long reply's finished paragraphs freeze (``MarkdownView.stream_markdown``),
so each render costs about the same however long the reply grows. ``end_reply`` renders the
authoritative final text in full, once.

Auto-scroll: while ``following`` is true, every growth of the content (the vertical
scroll bar's ``rangeChanged``) scrolls to the bottom; scrolling up clears it and scrolling
back to the bottom sets it again.

Colours come from the widget's palette, so light and dark themes both work; a palette
change re-renders each message's Markdown.
"""

from __future__ import annotations

import math
import time

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPalette
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QScrollArea,
    QSizePolicy,
    QStackedLayout,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.markdown import MarkdownView, is_dark, mix, plain_text
from app.thinking_fold import ThinkingFold

STREAM_RENDER_MS = 40  # the most often a streaming message is re-rendered
COLUMN_MAX_WIDTH = 860  # the message column's width on wide windows (centred)
BUBBLE_MAX_FRACTION = 0.8  # a user bubble's widest, as a share of the column
ROLE_TITLES = {"user": "You", "assistant": "Assistant", "error": "Error"}


def bubble_colour(palette: QPalette, role: str) -> QColor:
    base = palette.color(QPalette.ColorRole.Base)
    if role == "error":
        return mix(base, error_colour(palette), 0.18 if is_dark(palette) else 0.12)
    if role == "notice":
        return mix(base, notice_colour(palette), 0.22 if is_dark(palette) else 0.16)
    return mix(
        base, palette.color(QPalette.ColorRole.Highlight), 0.20 if is_dark(palette) else 0.11
    )


def error_colour(palette: QPalette) -> QColor:
    return QColor("#ef9a9a") if is_dark(palette) else QColor("#c62828")


def notice_colour(palette: QPalette) -> QColor:
    return QColor("#ffd54f") if is_dark(palette) else QColor("#f9a825")


class Notice(QLabel):
    """A tinted, rounded line above the messages (hidden while it has no text)."""

    RADIUS = 8

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("chatNotice")
        self.setWordWrap(True)
        self.setContentsMargins(12, 7, 12, 7)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.hide()

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt override)
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(bubble_colour(self.palette(), "notice"))
        painter.drawRoundedRect(self.rect(), self.RADIUS, self.RADIUS)
        painter.end()
        super().paintEvent(event)


class Bubble(QWidget):
    """A rounded, tinted background for a user message or an error."""

    RADIUS = 10

    def __init__(self, role: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.role = role

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt override)
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(bubble_colour(self.palette(), self.role))
        painter.drawRoundedRect(self.rect(), self.RADIUS, self.RADIUS)


def tool_button(text: str, name: str, tooltip: str) -> QToolButton:
    button = QToolButton()
    button.setText(text)
    button.setObjectName(name)
    button.setToolTip(tooltip)
    button.setAutoRaise(True)
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    font = button.font()
    font.setPointSizeF(font.pointSizeF() * 0.9)
    button.setFont(font)
    return button


class MessageWidget(QWidget):
    """One message: header, body, and a footer of tool buttons and a note; a reply of a
    reasoning model has its thinking folded between its header and its body. Every message
    can branch the chat; an earlier user message can be edited (in a branch); a regenerated
    reply steps through its versions (‹ 2/3 ›)."""

    branchClicked = Signal()
    forkEditClicked = Signal()
    versionClicked = Signal(int)  # the version to show (0-based)

    def __init__(self, role: str, text: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.role, self.text = role, text
        self.thinking_text = ""  # a reply's thinking (shown in ``thinking``, folded)
        self.streaming = False
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self._natural_width = 0.0
        align = Qt.AlignmentFlag.AlignRight if role == "user" else Qt.AlignmentFlag.AlignLeft

        self.header = QLabel(ROLE_TITLES[role])
        header_font = self.header.font()
        header_font.setBold(True)
        self.header.setFont(header_font)
        self.header.setContentsMargins(2, 0, 2, 0)  # in line with the body's text
        self.body = MarkdownView()
        self.copy_button = tool_button(
            "Copy", "copyButton", "Copy the message as text (the arrow: as Markdown)"
        )
        self.copy_button.clicked.connect(self.copy)
        copy_menu = QMenu(self.copy_button)
        self.copy_text_action = copy_menu.addAction("Copy as Text", self.copy)
        self.copy_markdown_action = copy_menu.addAction("Copy as Markdown", self.copy_markdown)
        self.copy_button.setMenu(copy_menu)
        self.copy_button.setPopupMode(QToolButton.ToolButtonPopupMode.MenuButtonPopup)
        self.branch_button = tool_button(
            "Branch",
            "branchButton",
            "Open a new chat with the history up to here (its cache is shared: no recompute)"
            if role != "user"
            else "Open a new chat with the history before this message, and this message to edit",
        )
        self.branch_button.clicked.connect(self.branchClicked)
        self.fork_edit_button = tool_button(
            "Edit", "forkEditButton", "Edit this message in a new branch of the chat, from here"
        )
        self.fork_edit_button.clicked.connect(self.forkEditClicked)
        self.fork_edit_button.setVisible(role == "user")
        self.version = 0
        self.versions = 1
        self.previous_button = tool_button("‹", "previousVersion", "The earlier version")
        self.next_button = tool_button("›", "nextVersion", "The later version")
        self.version_label = QLabel()
        self.version_label.setObjectName("versionLabel")
        self.previous_button.clicked.connect(lambda: self.versionClicked.emit(self.version - 1))
        self.next_button.clicked.connect(lambda: self.versionClicked.emit(self.version + 1))
        for widget in (self.previous_button, self.version_label, self.next_button):
            widget.hide()
        self.note = QLabel()
        self.note.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        note_font = self.note.font()
        note_font.setPointSizeF(note_font.pointSizeF() * 0.85)
        self.note.setFont(note_font)
        self.note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # cut at the chat's width rather than widen it (a small window): whole in its tooltip
        self.note.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.note.hide()

        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addWidget(self.header, 0, align)
        self.thinking = ThinkingFold()
        column.addWidget(self.thinking)
        # a reply's tool loop (app.tool_card): each step's text and its calls, before the answer
        self.steps = QWidget()
        self.steps.setObjectName("toolSteps")
        self.steps_column = QVBoxLayout(self.steps)
        self.steps_column.setContentsMargins(0, 0, 0, 4)
        self.steps_column.setSpacing(6)
        self.steps.hide()
        column.addWidget(self.steps)
        if role == "assistant":
            self.bubble = None
            column.addWidget(self.body)
        else:
            self.bubble = Bubble(role)
            inside = QVBoxLayout(self.bubble)
            inside.setContentsMargins(12, 7, 12, 7)
            inside.addWidget(self.body)
            column.addWidget(self.bubble, 0, align if role == "user" else Qt.AlignmentFlag(0))
        self.actions = QHBoxLayout()
        self.actions.setContentsMargins(0, 0, 0, 0)
        self.actions.setSpacing(0)
        for widget in (self.previous_button, self.version_label, self.next_button):
            self.actions.addWidget(widget)
        if role == "user":
            self.actions.addWidget(self.fork_edit_button)
        self.actions.addWidget(self.copy_button)
        if role in ("user", "assistant"):
            self.actions.addWidget(self.branch_button)
        else:
            self.branch_button.hide()
        footer = QHBoxLayout()
        footer.setContentsMargins(0, 0, 0, 0)
        footer.setSpacing(8)
        if role == "user":
            footer.addStretch()
            footer.addLayout(self.actions)
        else:
            footer.addLayout(self.actions)
            footer.addWidget(self.note, 1)  # the rest of the line: cut there, never wider
            footer.addStretch(0)  # the buttons to the left while there is no note
        column.addLayout(footer)
        self._apply_colours()
        self.refresh()

    def refresh(self) -> None:
        """Re-render the body from ``text`` (or a dim ellipsis while a reply has none yet)."""
        if self.streaming and not self.text:
            self.body.setPlainText("…")
        elif self.streaming:
            self.body.stream_markdown(self.text)
        else:
            self.body.show_markdown(self.text)
        if self.role == "user":
            self._natural_width = self.body.natural_width()
            self._fit_bubble()

    def set_thinking(self, text: str, tokens: int = 0) -> None:
        """The reply's thinking: streaming while the reply does, then whole with its count."""
        self.thinking_text = text
        self.thinking.set_thinking(text, tokens, streaming=self.streaming)

    def set_versions(self, version: int, versions: int) -> None:
        """A regenerated reply: version ``version`` (0-based) of ``versions`` is shown."""
        self.version, self.versions = version, versions
        many = versions > 1
        for widget in (self.previous_button, self.version_label, self.next_button):
            widget.setVisible(many)
        self.version_label.setText(f"{version + 1}/{versions}")
        self.previous_button.setEnabled(version > 0)
        self.next_button.setEnabled(version < versions - 1)

    def add_step_text(self, text: str) -> None:
        """What the model wrote before a step's tool calls, above their cards."""
        if text.strip():
            view = MarkdownView()
            view.setObjectName("toolStepText")
            view.show_markdown(text)
            self.steps_column.addWidget(view)
            self.steps.show()

    def add_card(self, card: QWidget) -> None:
        """A tool call's card, after what came before it in the reply."""
        self.steps_column.addWidget(card)
        self.steps.show()

    def cards(self) -> list[QWidget]:
        """The reply's tool call cards, in order."""
        return [
            w
            for i in range(self.steps_column.count())
            if (w := self.steps_column.itemAt(i).widget()) is not None
            and w.objectName() == "toolCallCard"
        ]

    def set_note(self, note: str) -> None:
        self.note.setText(note)
        self.note.setToolTip(note)
        self.note.setVisible(bool(note))

    def add_action(self, button: QToolButton) -> None:
        """Add a shared tool button (Edit goes before Copy, Regenerate after it)."""
        self.actions.insertWidget(0 if self.role == "user" else self.actions.count(), button)
        button.show()

    def copy(self) -> None:
        """The message as text, as a reader sees it (no Markdown marks)."""
        QGuiApplication.clipboard().setText(plain_text(self.text))

    def copy_markdown(self) -> None:
        QGuiApplication.clipboard().setText(self.text)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        if self.role == "user" and event.size().width() != event.oldSize().width():
            self._fit_bubble()

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt override)
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._apply_colours()

    def _fit_bubble(self) -> None:
        """A user bubble shrinks to short text and wraps long text at a share of the column."""
        margins = self.bubble.layout().contentsMargins()
        padding = margins.left() + margins.right()
        widest = max(80, int(self.width() * BUBBLE_MAX_FRACTION))
        self.bubble.setFixedWidth(min(widest, math.ceil(self._natural_width) + 2 + padding))

    def _apply_colours(self) -> None:
        palette = self.header.palette()
        if self.role == "error":
            for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text):
                palette.setColor(role, error_colour(self.palette()))
        self.header.setPalette(palette)


class ChatView(QWidget):
    """One chat session's messages; see the module's docstring.

    Roles: "user", "assistant", "error" are shown; "system" messages are not."""

    regenerateRequested = Signal()
    editRequested = Signal(str)  # the last user message's text
    branchRequested = Signal(int, bool)  # a message's index; True: to edit it (a user message)
    versionRequested = Signal(int, int)  # a reply's index, the version to show

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.following = True  # scroll to the bottom as content arrives
        self._messages: list[MessageWidget] = []
        self._streaming: MessageWidget | None = None
        self._pieces: list[str] = []  # streamed text not rendered yet
        self._thought: list[str] = []  # streamed thinking not shown yet
        self._busy = False

        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(STREAM_RENDER_MS)
        self._render_timer.timeout.connect(self._flush)

        self.placeholder = QLabel("Send a message to start chatting")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.placeholder.setWordWrap(True)
        self._content = QWidget()
        self._content.setBackgroundRole(QPalette.ColorRole.Base)
        self._column = QVBoxLayout(self._content)
        self._column.setSpacing(18)
        self._column.addStretch(1)
        self.scroll_area = QScrollArea()
        self.scroll_area.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll_area.setBackgroundRole(QPalette.ColorRole.Base)
        self.scroll_area.setWidget(self._content)
        self.setBackgroundRole(QPalette.ColorRole.Base)
        self.setAutoFillBackground(True)
        self.notice = Notice()
        pages = QWidget()
        self._pages = QStackedLayout(pages)
        self._pages.addWidget(self.placeholder)
        self._pages.addWidget(self.scroll_area)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(6)
        column.addWidget(self.notice)
        column.addWidget(pages, 1)

        bar = self.scroll_area.verticalScrollBar()
        bar.rangeChanged.connect(self._on_range_changed)
        bar.valueChanged.connect(self._on_scrolled)

        self.regenerate_button = tool_button(
            "Regenerate", "regenerateButton", "Generate this reply again"
        )
        self.regenerate_button.clicked.connect(self.regenerateRequested)
        self.edit_button = tool_button("Edit", "editButton", "Edit this message and send it again")
        self.edit_button.clicked.connect(self._on_edit)
        self._update_layout()

    # -- the public API --

    def set_messages(self, messages: list[tuple]) -> None:
        """Replace everything with (role, content) pairs, or (role, content, thinking,
        thinking tokens[, note[, (version, versions)[, tool steps]]]) (a reasoning model's
        thinking; the dim note under a reply; a regenerated reply's versions; the tool loop
        before a reply, as core.chats.tool_steps keeps it)."""
        self._stop_streaming()
        for message in self._messages:
            self._discard(message)
        self._messages = []
        self.following = True
        for role, content, *thought in messages:
            if role == "system":
                continue
            if role not in ROLE_TITLES:
                raise ValueError(f"unknown message role {role!r}")
            message = self._append(role, content)
            if thought and thought[0]:
                message.set_thinking(thought[0], *thought[1:2])
            if len(thought) > 2 and thought[2]:
                message.set_note(thought[2])
            if len(thought) > 3 and thought[3]:
                message.set_versions(*thought[3])
            if len(thought) > 4 and thought[4]:
                self._show_steps(message, thought[4])
        self._update_layout()

    def add_user_message(self, text: str) -> None:
        self._stop_streaming()
        self._append("user", text)
        self._update_layout()

    def begin_reply(self) -> None:
        """Append an empty assistant message that ``append_reply`` streams into."""
        self._stop_streaming()
        self._streaming = self._append("assistant", "", streaming=True)
        self._update_layout()

    def append_reply(self, text: str) -> None:
        """A streamed piece of the reply; rendered with the others at the next timer tick."""
        if self._streaming is None:
            self.begin_reply()
        self._pieces.append(text)
        if not self._render_timer.isActive():
            self._render_timer.start()

    def append_thinking(self, text: str) -> None:
        """A streamed piece of the reply's thinking (folded above it), shown at the next tick."""
        if self._streaming is None:
            self.begin_reply()
        self._thought.append(text)
        if not self._render_timer.isActive():
            self._render_timer.start()

    def end_reply(self, text: str, note: str = "", thinking: str = "", tokens: int = 0) -> None:
        """The final reply text (it replaces the streamed pieces), its ``thinking`` (folded
        above it, ``tokens`` long) and a dim note under it."""
        message = self._streaming
        self._render_timer.stop()
        self._pieces.clear()
        self._thought.clear()
        self._streaming = None
        if message is None:
            message = self._append("assistant", text)
        else:
            message.streaming = False
            message.text = text
            message.refresh()
        message.set_thinking(thinking, tokens)
        message.set_note(note)
        self._update_layout()

    def end_step(self, text: str) -> MessageWidget:
        """The streaming reply made tool calls: what it wrote moves above them (its cards
        follow: ``MessageWidget.add_card``), and the reply streams on below (the next step)."""
        if self._streaming is None:
            self.begin_reply()
        message = self._streaming
        self._render_timer.stop()
        self._pieces.clear()
        message.add_step_text(text)
        message.text = ""
        message.refresh()
        self._update_layout()
        return message

    def streaming_message(self) -> MessageWidget | None:
        return self._streaming

    def _show_steps(self, message: MessageWidget, steps: tuple[dict, ...]) -> None:
        from app.tool_card import ToolCallCard  # a stored reply's tool loop

        for step in steps:
            message.add_step_text(step.get("content", ""))
            results = {r.get("id"): r for r in step.get("results", [])}
            for call in step.get("tool_calls", []):
                message.add_card(ToolCallCard.finished(call, results.get(call.get("id"))))

    def add_error(self, message: str) -> None:
        """An error row; an interrupted reply keeps what it streamed (an empty one goes)."""
        streaming = self._streaming
        self._stop_streaming()
        if streaming is not None and not streaming.text:
            self._messages.remove(streaming)
            self._discard(streaming)
        self._append("error", message)
        self._update_layout()

    def remove_last_turn(self) -> None:
        """Remove the trailing replies and errors, then the last user message."""
        self._stop_streaming()
        while self._messages and self._messages[-1].role in ("assistant", "error"):
            self._discard(self._messages.pop())
        if self._messages and self._messages[-1].role == "user":
            self._discard(self._messages.pop())
        self._update_layout()

    def set_notice(self, text: str) -> None:
        """The line above the messages ("" hides it); it outlives ``set_messages``."""
        self.notice.setText(text)
        self.notice.setVisible(bool(text))

    def notice_text(self) -> str:
        return self.notice.text() if self.notice.isVisibleTo(self) else ""

    def set_busy(self, busy: bool) -> None:
        """While busy, Regenerate and Edit are disabled."""
        self._busy = busy
        self.regenerate_button.setEnabled(not busy)
        self.edit_button.setEnabled(not busy)

    def message_count(self) -> int:
        return len(self._messages)

    def message_text(self, i: int) -> str:
        """The raw Markdown of message ``i`` (a streaming reply: all its pieces so far)."""
        message = self._messages[i]
        return message.text + ("".join(self._pieces) if message is self._streaming else "")

    def message_role(self, i: int) -> str:
        return self._messages[i].role

    def message_thinking(self, i: int) -> str:
        """The thinking of message ``i`` (a streaming reply: all its pieces so far)."""
        message = self._messages[i]
        return message.thinking_text + (
            "".join(self._thought) if message is self._streaming else ""
        )

    def message_widget(self, i: int) -> MessageWidget:
        return self._messages[i]

    # -- slots --

    def _flush(self) -> None:
        """Render the streaming message with the pieces gathered since the last render."""
        message = self._streaming
        if message is None or not (self._pieces or self._thought):
            return
        if self._thought:
            message.set_thinking(message.thinking_text + "".join(self._thought))
            self._thought.clear()
            if not self._pieces:
                return
        message.text += "".join(self._pieces)
        self._pieces.clear()
        started = time.perf_counter()
        message.refresh()
        elapsed_ms = (time.perf_counter() - started) * 1000
        # a slow render (a very long reply) waits longer, so it takes at most 1/4 of the loop
        self._render_timer.setInterval(max(STREAM_RENDER_MS, int(elapsed_ms * 4)))

    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self.following:
            self.scroll_area.verticalScrollBar().setValue(maximum)

    def _on_scrolled(self, value: int) -> None:
        self.following = value >= self.scroll_area.verticalScrollBar().maximum() - 4

    def _on_branch(self, message: MessageWidget, edit: bool) -> None:
        if message in self._messages and not message.streaming:
            self.branchRequested.emit(self._messages.index(message), edit)

    def _on_edit(self) -> None:
        users = [message for message in self._messages if message.role == "user"]
        if users:
            self.editRequested.emit(users[-1].text)

    # -- helpers --

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        side = max(12, (event.size().width() - COLUMN_MAX_WIDTH) // 2)
        self._column.setContentsMargins(side, 16, side, 16)

    def _append(self, role: str, text: str, streaming: bool = False) -> MessageWidget:
        message = MessageWidget(role, text)
        message.branchClicked.connect(lambda: self._on_branch(message, False))
        message.forkEditClicked.connect(lambda: self._on_branch(message, True))
        message.versionClicked.connect(
            lambda version: self.versionRequested.emit(self._messages.index(message), version)
        )
        if streaming:
            message.streaming = True
            message.refresh()
        self._column.insertWidget(self._column.count() - 1, message)  # before the stretch
        self._messages.append(message)
        return message

    def _discard(self, message: MessageWidget) -> None:
        for button in (self.regenerate_button, self.edit_button):
            if message.isAncestorOf(button):
                button.hide()
                button.setParent(self)
        self._column.removeWidget(message)
        message.hide()
        message.deleteLater()

    def _stop_streaming(self) -> None:
        """Finish a streaming reply as it stands (its pieces rendered)."""
        if self._streaming is not None:
            self._render_timer.stop()
            self._streaming.text += "".join(self._pieces)
            self._pieces.clear()
            self._streaming.streaming = False
            self._streaming.set_thinking(self._streaming.thinking_text + "".join(self._thought))
            self._thought.clear()
            self._streaming.refresh()
            self._streaming = None

    def _update_layout(self) -> None:
        """The placeholder when empty; Edit on the last user message, Regenerate on the last
        message when it is an assistant's reply (not after an error or a newer user message)."""
        self._pages.setCurrentIndex(1 if self._messages else 0)
        for button in (self.regenerate_button, self.edit_button):
            button.hide()
            button.setParent(self)
        users = [message for message in self._messages if message.role == "user"]
        for message in users:  # an earlier message is edited in a branch; the last in place
            message.fork_edit_button.setVisible(message is not users[-1])
        if users:
            users[-1].add_action(self.edit_button)
        if self._messages and self._messages[-1].role == "assistant":
            self._messages[-1].add_action(self.regenerate_button)
        self.set_busy(self._busy)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return QSize(600, 500)
