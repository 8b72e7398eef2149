"""The sidebar of chats: search, a list newest-updated first, new / rename / delete.

The list reads and writes the :class:`~core.chats.store.ChatStore` itself (titles,
deletes); what a session means to the rest of the window leaves through signals. The
main window creates new sessions (they take the current settings), so "New chat" only
asks for one.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, QModelIndex, QObject, QPoint, QRect, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QColor, QFont, QKeySequence, QPainter, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from core.chats.store import ChatStore, Session
from core.errors import StoreError

UNTITLED = "New chat"
SEARCH_DELAY_MS = 150
ID_ROLE = Qt.ItemDataRole.UserRole  # the session id
TITLE_ROLE = Qt.ItemDataRole.UserRole + 1  # the stored title (None when untitled), for editing
WHEN_ROLE = Qt.ItemDataRole.UserRole + 2  # the second line: when it was last updated


def relative_time(then: float, now: float | None = None) -> str:
    """When a chat was last updated, as a sidebar shows it: "just now", "5 min ago",
    "3 h ago", "yesterday", "Monday", "Mar 4", "Mar 4, 2024"."""
    now = time.time() if now is None else now
    seconds = max(0.0, now - then)
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    t, today = time.localtime(then), time.localtime(now)
    days = _day_number(today) - _day_number(t)
    if days == 0:
        return f"{int(seconds // 3600)} h ago"
    if days == 1:
        return "yesterday"
    if days < 7:
        return time.strftime("%A", t)
    if t.tm_year == today.tm_year:
        return f"{time.strftime('%b', t)} {t.tm_mday}"
    return f"{time.strftime('%b', t)} {t.tm_mday}, {t.tm_year}"


def _day_number(t: time.struct_time) -> int:
    """Days since the epoch of a local date (for "yesterday" across month ends)."""
    return int(time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 12, 0, 0, 0, 0, -1)) // 86400)


class SessionDelegate(QStyledItemDelegate):
    """Draws a session as its title over a dim "when" line; editing edits the title only
    and reports it through ``renamed`` instead of writing the item."""

    renamed = Signal(int, str)  # session id, new title

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        line = option.fontMetrics.lineSpacing()
        return QSize(option.rect.width(), 2 * line + 12)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.text = ""
        style = opt.widget.style() if opt.widget else None
        if style is not None:  # background, selection and focus, without the text
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        group = (
            QPalette.ColorGroup.Active
            if option.state & QStyle.StateFlag.State_Active
            else QPalette.ColorGroup.Inactive
        )
        text = option.palette.color(
            group, QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text
        )
        dim = QColor(text)
        dim.setAlphaF(0.6)
        top, bottom = self._lines(option.rect, option.fontMetrics.lineSpacing())
        painter.save()
        font = QFont(option.font)
        font.setItalic(index.data(TITLE_ROLE) is None)  # "New chat": not a title the user gave
        painter.setFont(font)
        painter.setPen(text)
        painter.drawText(
            top,
            Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
            option.fontMetrics.elidedText(index.data(), Qt.TextElideMode.ElideRight, top.width()),
        )
        painter.setFont(option.font)
        painter.setPen(dim)
        painter.drawText(
            bottom,
            Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
            option.fontMetrics.elidedText(
                index.data(WHEN_ROLE) or "", Qt.TextElideMode.ElideRight, bottom.width()
            ),
        )
        painter.restore()

    def updateEditorGeometry(
        self, editor: QWidget, option: QStyleOptionViewItem, index: QModelIndex
    ) -> None:
        top, _ = self._lines(option.rect, option.fontMetrics.lineSpacing())
        editor.setGeometry(top.adjusted(-4, -3, 4, 3))

    def setEditorData(self, editor: QWidget, index: QModelIndex) -> None:
        editor.setText(index.data(TITLE_ROLE) or "")
        editor.setPlaceholderText(UNTITLED)

    def setModelData(self, editor: QWidget, model, index: QModelIndex) -> None:
        title = editor.text().strip()
        if title != (index.data(TITLE_ROLE) or ""):
            self.renamed.emit(index.data(ID_ROLE), title)

    @staticmethod
    def _lines(rect: QRect, line: int) -> tuple[QRect, QRect]:
        inner = rect.adjusted(10, 6, -10, -6)
        return QRect(inner.left(), inner.top(), inner.width(), line), QRect(
            inner.left(), inner.top() + line, inner.width(), line
        )


class SessionList(QWidget):
    """Chats, most recently updated first, filtered live by a search over titles and
    messages.

    ``sessionSelected`` fires when the user picks a chat (click, keys); ``select()`` and
    ``refresh()`` change the highlight without it. ``current_id()`` is the chat picked
    last, even while a search hides its row. Store failures (``StoreError``) show in
    ``error_label`` and leave through ``error``."""

    sessionSelected = Signal(int)
    sessionDeleted = Signal(int, str)  # id, name (the engine forgets the name's cache)
    newRequested = Signal()
    error = Signal(str)

    def __init__(self, store: ChatStore, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self._current: int | None = None
        self._deleting: int | None = None  # the session confirm_box asks about
        self._filling = False  # repopulating: selection changes are not the user's
        self._refresh_pending = False  # a refresh waits for the pointer to leave the list
        self.confirm_box: QMessageBox | None = None
        self.context_menu: QMenu | None = None

        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setClearButtonEnabled(True)
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self.refresh)
        self._search_held = False  # a search timer stopped by hideEvent, run on showEvent
        self.search.textChanged.connect(self._search_timer.start)

        self.list = QListWidget()
        self.delegate = SessionDelegate(self.list)
        self.delegate.renamed.connect(
            self._on_renamed,  # after the editor has closed
            type=Qt.ConnectionType.QueuedConnection,
        )
        self.list.setItemDelegate(self.delegate)
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        # rename_action edits
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._on_context_menu)
        self.list.viewport().installEventFilter(self)  # a right click opens the menu, not the chat
        self.list.installEventFilter(self)  # losing the focus: a waiting refresh
        self.list.currentItemChanged.connect(self._on_current_item_changed)

        self.empty_label = QLabel("No chats match")
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #c0392b;")
        for label in (self.empty_label, self.error_label):
            label.setAlignment(Qt.AlignmentFlag.AlignCenter)
            label.hide()
        self.empty_label.setEnabled(False)  # dim

        self.new_action = QAction("New chat", self)
        self.new_action.setShortcut(QKeySequence.StandardKey.New)
        self.new_action.triggered.connect(self.newRequested)
        self.rename_action = QAction("Rename Chat", self)
        self.rename_action.setShortcut(QKeySequence(Qt.Key.Key_F2))
        self.rename_action.triggered.connect(lambda: self.rename())  # not rename(checked)
        self.delete_action = QAction("Delete Chat…", self)
        self.delete_action.setShortcut(QKeySequence.StandardKey.Delete)
        self.delete_action.triggered.connect(lambda: self.delete())
        for action in (self.rename_action, self.delete_action):  # only while the list has focus
            action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            self.list.addAction(action)
        # window-wide: share this action rather than a second Ctrl+N
        self.addAction(self.new_action)
        self.new_button = QPushButton("New chat")
        shortcut = self.new_action.shortcut().toString(QKeySequence.SequenceFormat.NativeText)
        self.new_button.setToolTip(f"New chat ({shortcut})")
        self.new_button.clicked.connect(self.new_action.trigger)

        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.new_button)
        column.addWidget(self.search)
        column.addWidget(self.error_label)
        column.addWidget(self.empty_label)
        column.addWidget(self.list, 1)
        self.refresh()

    # -- API --

    def current_id(self) -> int | None:
        return self._current

    def select(self, session_id: int | None) -> None:
        """Highlight ``session_id`` (None: nothing) without emitting ``sessionSelected``."""
        self._current = session_id
        self._filling = True
        try:
            item = self._item(session_id)
            self.list.setCurrentItem(item)
            if item is None:
                self.list.clearSelection()
            else:
                self.list.scrollToItem(item)
        finally:
            self._filling = False

    def hideEvent(self, event) -> None:
        """A search typed just before the list is hidden waits until it shows again: when
        the window closes, the store it would read may be closed before its timer fires."""
        self._search_held = self._search_timer.isActive()
        self._search_timer.stop()
        super().hideEvent(event)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._search_held:
            self._search_held = False
            self.refresh()

    def refresh(self, select_id: int | None = None) -> None:
        """Reload from the store (filtered by the search), keeping the highlighted chat,
        or highlighting ``select_id`` when given."""
        query = self.search.text().strip()
        try:
            sessions = self.store.search(query) if query else self.store.list_sessions()
        except StoreError as exc:
            self._show_error(str(exc))
            return
        self.error_label.hide()
        self._refresh_pending = False
        target = self._current if select_id is None else select_id
        now = time.time()
        self._filling = True
        try:
            self.list.clear()
            for session in sessions:
                self.list.addItem(self._new_item(session, now))
        finally:
            self._filling = False
        self.empty_label.setVisible(bool(query) and not sessions)
        self.select(target)

    def refresh_when_away(self) -> None:
        """Refresh for a change the user did not make (a reply ended in another chat): now,
        or, while the pointer is over the list, once it leaves (or the list loses the focus)
        so that the rows never move under the pointer (issue 45.7)."""
        if self.list.viewport().underMouse():
            self._refresh_pending = True
            return
        self.refresh()

    def _pending_refresh(self) -> None:
        if self._refresh_pending:
            self._refresh_pending = False
            self.refresh()

    def rename(self, session_id: int | None = None) -> None:
        """Edit a chat's title in place (default: the highlighted one)."""
        item = self._item(self._current if session_id is None else session_id)
        if item is not None:
            self.list.editItem(item)

    def delete(self, session_id: int | None = None) -> None:
        """Ask before deleting a chat (default: the highlighted one); ``confirm_box``
        answers, and only its Yes deletes."""
        session_id = self._current if session_id is None else session_id
        item = self._item(session_id)
        if item is None:
            return
        self._deleting = session_id
        if self.confirm_box is None:
            self.confirm_box = QMessageBox(
                QMessageBox.Icon.Question,
                "Delete chat",
                "",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                self,
            )
            self.confirm_box.button(QMessageBox.StandardButton.Yes).setText("Delete")
            self.confirm_box.finished.connect(self._on_confirm_finished)
        self.confirm_box.setText(f"Delete “{item.text()}”? Its messages and cached KV are removed.")
        self.confirm_box.setDefaultButton(QMessageBox.StandardButton.No)
        self.confirm_box.open()

    # -- slots --

    def _on_current_item_changed(self, item: QListWidgetItem | None) -> None:
        if self._filling or item is None:
            return
        session_id = item.data(ID_ROLE)
        if session_id != self._current:
            self._current = session_id
            self.sessionSelected.emit(session_id)

    def _on_renamed(self, session_id: int, title: str) -> None:
        try:
            self.store.rename_session(session_id, title)
        except StoreError as exc:
            self._show_error(str(exc))
            return
        self.refresh()

    def _on_confirm_finished(self) -> None:
        box, session_id = self.confirm_box, self._deleting
        self._deleting = None
        if box is None or session_id is None:
            return
        if box.standardButton(box.clickedButton()) != QMessageBox.StandardButton.Yes:
            return
        try:
            session = self.store.get_session_by_id(session_id)
            self.store.delete_session(session_id)
        except StoreError as exc:
            self._show_error(str(exc))
            return
        if self._current == session_id:
            self._current = None
        self.refresh()
        self.sessionDeleted.emit(session_id, session.name if session is not None else "")

    def _on_context_menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        session_id = item.data(ID_ROLE)
        self.context_menu = QMenu(self)
        for text, slot, shortcut in (
            ("Rename", self.rename, self.rename_action.shortcut()),
            ("Delete…", self.delete, self.delete_action.shortcut()),
        ):
            entry = self.context_menu.addAction(text, lambda slot=slot: slot(session_id))
            entry.setShortcut(shortcut)  # shown, as in the Chat menu; the list's own act
            entry.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        self.context_menu.popup(self.list.viewport().mapToGlobal(pos))

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.list.viewport() and event.type() == QEvent.Type.Leave:
            self._pending_refresh()
        if watched is self.list and event.type() == QEvent.Type.FocusOut:
            self._pending_refresh()
        if (
            watched is self.list.viewport()
            and event.type() == QEvent.Type.MouseButtonPress
            and event.button() == Qt.MouseButton.RightButton
        ):
            return True  # the context menu follows; the highlighted chat stays
        return super().eventFilter(watched, event)

    # -- helpers --

    def _new_item(self, session: Session, now: float) -> QListWidgetItem:
        item = QListWidgetItem(session.title or UNTITLED)
        item.setData(ID_ROLE, session.id)
        item.setData(TITLE_ROLE, session.title)
        item.setData(WHEN_ROLE, relative_time(session.updated_at, now))
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
        updated = time.strftime("%c", time.localtime(session.updated_at))
        item.setToolTip(f"{session.title or UNTITLED}\nUpdated {updated}")
        return item

    def _item(self, session_id: int | None) -> QListWidgetItem | None:
        if session_id is None:
            return None
        for row in range(self.list.count()):
            item = self.list.item(row)
            if item.data(ID_ROLE) == session_id:
                return item
        return None

    def _show_error(self, message: str) -> None:
        self.error_label.setText(message)
        self.error_label.show()
        self.error.emit(message)
