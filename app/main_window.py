"""The main window: sessions on the left, the chat in the middle, the live memory and cache
panels on the right (each folds to one line); a toolbar for the model, the chat's settings and
the API server.

The window only talks to the engine through its :class:`~app.bridge.EngineBridge`, and to
the chat history through a :class:`~core.chats.store.ChatStore`; it never blocks: replies,
model loads and server stops all come back as signals.

One chat reply runs at a time. While it streams, every chat can be opened, a new one made
and its settings changed; a message sent in another chat waits its turn (shown in its chat)
and starts when the running reply ends. A reply whose chat is not open goes on and is saved.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QPalette
from PySide6.QtWidgets import (
    QFrame,
    QLabel,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.bridge import EngineBridge
from app.cache_panel import CachePanel
from app.chat_files import ChatFiles
from app.chat_header import base_model_notice, chat_header_text
from app.chat_settings import DEFAULT_SAMPLING, SessionSettingsDialog
from app.chat_view import ChatView
from app.collapsible import CollapsibleSection
from app.composer import Composer
from app.context_bar import ContextBar
from app.downloads import DownloadManager, DownloadsDialog, DownloadsStatus
from app.look import FOCUS_RING
from app.mcp_servers import McpServersPage
from app.memory_panel import MemoryPanel
from app.model_card import ModelCardDialog
from app.model_picker import ModelPickerDialog
from app.server_controls import ServerControls
from app.session_list import SessionList
from app.settings_dialogs import AppSettings, AppSettingsDialog
from app.window_fit import PANELS_MIN_WIDTH, WindowFit
from app.window_replies import ChatReplies, LiveFigures, WaitingAsk, chat_title, shown
from app.window_tools import CHAT_KEY as CHAT_TOOLS
from app.window_tools import WindowTools
from core.chats.settings import usable
from core.chats.store import ChatStore, Session, readable
from core.chats.turn import ChatTurn, engine_figures
from core.errors import StoreError
from core.models.base_models import BASE_LABEL

log = logging.getLogger(__name__)

STATUS_TIMEOUT_MS = 10_000  # a notice or an error in the status bar, then what is going on


class MainWindow(ChatReplies, QMainWindow):
    """``server_port``: where "Serve API" listens, instead of the settings' port (0: any free
    port). ``fallback_model``: loaded instead when the first model cannot be (the last-used
    model is gone), and said so."""

    def __init__(
        self,
        bridge: EngineBridge,
        store: ChatStore,
        settings: AppSettings | None = None,
        parent: QWidget | None = None,
        server_port: int | None = None,
        fallback_model: str | None = None,
    ):
        super().__init__(parent)
        self.bridge, self.store = bridge, store
        self.settings = settings if settings is not None else AppSettings()
        self.model_name = ""
        self.session: Session | None = None
        self._turn: ChatTurn | None = None  # the reply running now (in any chat)
        self._from_composer = False  # it came from the composer (not a regenerate)
        self._reply = ""  # what it streamed so far
        self._thinking = ""  # the thinking it streamed so far (a reasoning model's)
        self._made_with = None  # its model and sampling
        self._waiting: list[WaitingAsk] = []  # messages that wait for it, in order
        self._calls: tuple = ()  # the tool calls its last request made (a tool loop's step)
        self._live = LiveFigures()  # its prompt, tokens so far and speed
        self._last_stats = None  # the engine's last figures (EngineStats)
        self.model_card = None  # the open model info card
        self._loading_spec = ""
        self._fallback_model = fallback_model
        self.error_box: QMessageBox | None = None

        self.setWindowTitle("RadixChat")
        self.setStyleSheet(FOCUS_RING)
        self.setUnifiedTitleAndToolBarOnMac(True)
        self.resize(1280, 800)
        self.server = ServerControls(
            self, bridge, self.settings, self._set_state_text, port_override=server_port
        )
        self.downloads = DownloadManager(bridge.data_root, self)  # they go on while you chat
        self.chat_files = ChatFiles(
            self, store, lambda: self.session.id if self.session else None, self._set_state_text
        )
        self.downloads_dialog: DownloadsDialog | None = None
        self.tools = WindowTools(  # MCP servers: the chats' tools
            self, bridge.data_root, store, self.settings, lambda: self.session, self._set_state_text
        )
        self.tools.chatChanged.connect(self._on_chat_tools_saved)
        self._build_widgets()
        self._build_actions()
        self._connect()
        self._restore_layout()
        self._open_initial_session()
        self._update_state()
        self._set_state_text("Loading the model…", 0)

    # ------------------------------------------------------------------ layout
    def _build_widgets(self) -> None:
        self.sessions = SessionList(self.store)
        self.chat = ChatView()
        self.composer = Composer()
        middle = QWidget()
        column = QVBoxLayout(middle)
        column.setContentsMargins(8, 8, 8, 8)
        self.chat_header = QLabel()  # the system prompt and preset the open chat uses
        self.chat_header.setObjectName("chatHeader")
        self.chat_header.setWordWrap(False)
        self.chat_header.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.chat_header.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.chat_header.setTextInteractionFlags(Qt.TextInteractionFlag.LinksAccessibleByMouse)
        self.chat_header.linkActivated.connect(lambda _link: self.edit_session_settings())
        column.addWidget(self.chat_header)
        column.addWidget(self.chat, 1)
        column.addWidget(self.composer)
        self.memory_panel, self.cache_panel = MemoryPanel(), CachePanel()
        self.sections = {
            "cache": CollapsibleSection("Cache", self.cache_panel),
            "memory": CollapsibleSection("Memory", self.memory_panel),
        }
        self.panel_splitter = QSplitter(Qt.Orientation.Vertical)
        self.panel_splitter.setObjectName("panelsSplitter")
        for section in self.sections.values():
            self.panel_splitter.addWidget(section)
            section.toggled.connect(self._on_section_folded)
        # folded sections are one line high: the room they leave goes to a stretch below, so
        # the splitter's small height never caps the window's (View › Show Panels: this column)
        inside = QWidget()
        panel_column = QVBoxLayout(inside)
        panel_column.setContentsMargins(0, 0, 0, 0)
        panel_column.addWidget(self.panel_splitter, 1)
        panel_column.addStretch(0)
        # in a scroll area: open panels never hold the window above the size a user wants
        # (a small window folds them: app.window_fit)
        self.panels = QScrollArea()
        self.panels.setObjectName("panelsColumn")
        self.panels.setWidget(inside)
        self.panels.setWidgetResizable(True)
        self.panels.setFrameShape(QFrame.Shape.NoFrame)
        self.panels.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.panels.setMinimumWidth(PANELS_MIN_WIDTH)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("mainSplitter")
        self.splitter.addWidget(self.sessions)
        self.splitter.addWidget(middle)
        self.splitter.addWidget(self.panels)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([240, 640, 400])
        self.setCentralWidget(self.splitter)
        self.fit = WindowFit(
            self.splitter,
            self.sections,
            lambda: self.settings.collapsed_panels,
            lambda: self.panels_action.isChecked(),
        )

        self.model_label = QLabel()
        self.state_label = QLabel()
        self._state_timer = QTimer(self)  # takes a notice away (_set_state_text)
        self._state_timer.setSingleShot(True)
        self._state_timer.timeout.connect(self._rest_state_text)
        self.state_label.setContentsMargins(12, 0, 0, 0)
        self.speed_label = QLabel()
        self.server_label = self.server.label
        bar = self.statusBar()
        bar.addWidget(self.model_label)
        bar.addWidget(self.state_label, 1)
        self.downloads_status = DownloadsStatus(self.downloads)
        bar.addPermanentWidget(self.downloads_status)
        self.context_bar = ContextBar()
        bar.addPermanentWidget(self.context_bar)
        bar.addPermanentWidget(self.speed_label)
        bar.addPermanentWidget(self.server_label)

    def _build_actions(self) -> None:
        def action(text: str, slot, shortcut=None, tip: str = "") -> QAction:
            act = QAction(text, self)
            act.triggered.connect(lambda _checked=False: slot())
            if shortcut is not None:
                act.setShortcut(QKeySequence(shortcut))
            act.setToolTip(tip or text)
            return act

        self.new_action = self.sessions.new_action  # Ctrl+N, window-wide; newRequested -> new_chat
        self.model_action = action("Model…", self.choose_model, "Ctrl+M", "Choose the model")
        self.session_settings_action = action(
            "Chat Settings…",
            self.edit_session_settings,
            "Ctrl+Shift+,",
            "System prompt, sampling and presets for this chat",
        )
        self.app_settings_action = action(
            "Preferences…",
            self.edit_app_settings,
            "Ctrl+,",  # Cmd+, on macOS, as every Mac app
            "Data folder, memory and disk budgets",
        )
        self.app_settings_action.setMenuRole(QAction.MenuRole.PreferencesRole)
        self.regenerate_action = action("Regenerate Reply", self.regenerate, "Ctrl+R")
        self.stop_action = action(
            "Stop", self.stop_reply, Qt.Key.Key_Escape, "Stop the reply (Esc)"
        )
        self.quit_action = action("Quit", self.close, "Ctrl+Q")  # Cmd+Q on macOS
        self.quit_action.setMenuRole(QAction.MenuRole.QuitRole)
        self.panels_action = QAction("Show Panels", self)
        self.panels_action.setShortcut(QKeySequence("Ctrl+Shift+P"))
        self.panels_action.setToolTip("Show or hide the memory and cache panels")
        self.panels_action.setCheckable(True)
        self.panels_action.setChecked(not self.settings.panels_hidden)
        self.panels_action.toggled.connect(self._show_panels)
        self.serve_action, self.group_action = self.server.serve_action, self.server.group_action

        menus = self.menuBar()
        file_menu = menus.addMenu("&File")
        file_menu.addAction(self.new_action)
        file_menu.addAction(self.chat_files.import_action)
        file_menu.addAction(self.chat_files.export_action)
        file_menu.addSeparator()
        for act in (self.app_settings_action, self.quit_action):
            file_menu.addAction(act)
        chat_menu = menus.addMenu("&Chat")
        for act in (self.regenerate_action, self.stop_action, self.session_settings_action):
            chat_menu.addAction(act)
        chat_menu.addSeparator()  # the chat list's own (F2, Del: while the list has the focus)
        chat_menu.addAction(self.sessions.rename_action)
        chat_menu.addAction(self.sessions.delete_action)
        self.downloads_action = action(
            "Downloads…",
            self.open_downloads,
            "Ctrl+J",
            "Downloads from the hub: cancel, resume, load",
        )
        self.model_info_action = action(
            "Model Info…",
            self.show_model_card,
            "Ctrl+I",
            "What the loaded model is, its chat template, what the cache holds for it",
        )
        model_menu = menus.addMenu("&Model")
        model_menu.addAction(self.model_action)
        model_menu.addAction(self.model_info_action)
        model_menu.addAction(self.downloads_action)
        server_menu = menus.addMenu("&Server")
        for act in self.server.actions():
            server_menu.addAction(act)
        menus.addMenu(self.tools.menu)  # MCP servers for the chat
        menus.addMenu("&View").addAction(self.panels_action)

        toolbar = self.addToolBar("Main")
        toolbar.setObjectName("mainToolBar")
        toolbar.setMovable(False)
        toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.model_button = QToolButton()
        self.model_button.setDefaultAction(self.model_action)
        self.model_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        toolbar.addWidget(self.model_button)
        toolbar.addAction(self.session_settings_action)
        toolbar.addSeparator()
        toolbar.addAction(self.serve_action)
        spacer = QWidget()
        spacer.setSizePolicy(
            spacer.sizePolicy().Policy.Expanding, spacer.sizePolicy().Policy.Preferred
        )
        toolbar.addWidget(spacer)
        toolbar.addAction(self.panels_action)
        self.toolbar = toolbar

    def _connect(self) -> None:
        bridge = self.bridge
        bridge.loadProgress.connect(self._on_load_progress)
        bridge.modelLoading.connect(self._on_model_loading)
        bridge.modelReady.connect(self._on_ready)
        bridge.loadFailed.connect(self._on_load_failed)
        bridge.progress.connect(self._on_prefill_progress)
        bridge.token.connect(self._on_token)
        bridge.thinking.connect(self._on_thinking)
        bridge.decoded.connect(self._on_decoded)
        bridge.toolCalls.connect(self._on_tool_calls)
        bridge.finished.connect(self._on_finished)
        self.tools.loop.stepDone.connect(self._on_step_done)
        bridge.failed.connect(self._on_failed)
        bridge.statsUpdated.connect(self.memory_panel.update_stats)
        bridge.statsUpdated.connect(self._keep_stats)
        bridge.statsUpdated.connect(self.cache_panel.update_totals)
        self.chat.branchRequested.connect(self.branch_chat)
        self.chat.versionRequested.connect(self.choose_version)
        self.composer.sendRequested.connect(self.send)
        self.composer.stopRequested.connect(self.stop_reply)
        self.composer.editCancelled.connect(lambda: self._set_state_text("Edit cancelled", 3000))
        self.chat.regenerateRequested.connect(self.regenerate)
        self.chat.editRequested.connect(self.composer.start_edit)
        self.sessions.sessionSelected.connect(self.open_session)
        self.sessions.sessionDeleted.connect(self._on_session_deleted)
        self.sessions.newRequested.connect(self.new_chat)
        self.downloads_status.button.clicked.connect(self.open_downloads)
        self.chat_files.imported.connect(self._on_imported)
        self.downloads.finished.connect(self._on_download_finished)
        self.downloads.failed.connect(
            lambda target, message: self._set_state_text(f"Download of {target}: {message}")
        )

    def _restore_layout(self) -> None:
        geometry, state = self.settings.window_geometry, self.settings.window_state
        if geometry:
            self.restoreGeometry(geometry)
        if state:
            self.restoreState(state)
        if self.settings.splitter_state:
            self.splitter.restoreState(self.settings.splitter_state)
        self.panels.setVisible(self.panels_action.isChecked())
        for name in self.settings.collapsed_panels & set(self.sections):
            self.sections[name].set_collapsed(True)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        if hasattr(self, "fit"):  # built
            self.fit.fit(self.width(), self.height())

    def _keep_stats(self, stats) -> None:
        self._last_stats = stats  # the model card's cache figures

    def _show_panels(self, shown: bool) -> None:
        self.panels.setVisible(shown)
        self.settings.panels_hidden = not shown

    def _on_section_folded(self, _collapsed: bool) -> None:
        if self.fit.folding:  # a small window's fold: not the user's choice
            return
        self.settings.collapsed_panels = {
            name for name, section in self.sections.items() if section.collapsed
        }

    def closeEvent(self, event: QCloseEvent) -> None:
        self.settings.window_geometry = bytes(self.saveGeometry().data())
        self.settings.window_state = bytes(self.saveState().data())
        if not self.fit.small:  # a small window's columns are not the user's choice
            self.settings.splitter_state = bytes(self.splitter.saveState().data())
        self.tools.shutdown()  # MCP servers: a running call is cancelled, children end
        self.server.stop()  # the API server (the app's exit waits for it) and a group's
        self.downloads.cancel_all()  # their bytes are kept: the next start resumes them
        self._keep_on_close()  # the running reply: what came so far is stored
        super().closeEvent(event)

    # ------------------------------------------------------------------ sessions
    def _open_initial_session(self) -> None:
        """The chat open when the app last closed, else the most recent, else a new one."""
        try:
            sessions = self.store.list_sessions()
        except StoreError as exc:
            self._set_state_text(f"Could not read the chats: {exc}")
            sessions = []
        last = self.settings.last_session
        if sessions:
            self.open_session(last if any(s.id == last for s in sessions) else sessions[0].id)
        else:
            self.new_chat()

    def new_chat(self) -> None:
        """A fresh session (the current one is reused while it is still empty), with the
        new-chat default of Chat Settings, else the current chat's settings."""
        if self.session is not None and not self.chat.message_count():
            self.composer.input.setFocus()
            return
        default = self.settings.new_chat_defaults
        if default is not None:
            settings, system = {**DEFAULT_SAMPLING, **default.sampling}, default.system_prompt
        elif self.session is not None:
            settings, system = dict(self.session.settings), self.session.system_prompt
        else:
            settings, system = dict(DEFAULT_SAMPLING), None
        try:
            session = self.store.create_session(settings=settings, system_prompt=system)
        except StoreError as exc:
            self._set_state_text(f"Could not create a chat: {exc}")
            return
        self.sessions.refresh(select_id=session.id)
        self.open_session(session.id)

    def open_session(self, session_id: int, reload: bool = False) -> None:
        """Show the chat ``session_id`` (``reload``: again, as stored, when it is open)."""
        if not reload and self.session is not None and self.session.id == session_id:
            if self.sessions.current_id() != self.session.id:
                self.sessions.select(self.session.id)
            return
        try:
            session = self.store.get_session_by_id(session_id)
            messages, damage = readable(
                self.store.messages(session_id) if session is not None else []
            )
        except StoreError as exc:
            self._set_state_text(f"Could not open the chat: {exc}")
            return
        if session is None:
            return
        self.session = session
        self.settings.last_session = session.id
        self.composer.finish_edit()
        self.chat.set_messages(shown(messages))
        figures = engine_figures(m.stats for m in messages if m.role == "assistant")
        self.cache_panel.set_turns(figures)
        self._show_context(figures)
        self._show_pending(session.id)
        if self.sessions.current_id() != session.id:
            self.sessions.select(session.id)
        self._update_title()
        self._update_state()
        if damage or session.damaged:  # shown as read (bad bytes as U+FFFD), said in one row
            self.chat.add_error(f"Damaged: {damage or 'this chat: ' + session.damaged}")

    def _on_imported(self, session_id: int) -> None:
        self.sessions.refresh(select_id=session_id)
        self.open_session(session_id)

    def _on_session_deleted(self, session_id: int, name: str) -> None:
        if name:
            self.bridge.forget_session(name)  # its cached KV, in RAM and on disk
        self._waiting = [ask for ask in self._waiting if ask.session_id != session_id]
        if self._turn is not None and self._turn.session.id == session_id:
            self.bridge.cancel()  # its reply has nowhere to go
            self._turn = None
        if self.session is not None and self.session.id == session_id:
            self.session = None
            self._open_initial_session()
        self._update_state()

    def _shown_messages(self) -> list:
        """The open chat's stored messages as the chat view shows them (no system ones)."""
        messages = readable(self.store.messages(self.session.id))[0]
        return [m for m in messages if m.role != "system"]

    def branch_chat(self, index: int, edit: bool = False) -> None:
        """Branch the open chat at its ``index``-th message shown: a new chat with the history
        up to it (``edit``, or a user message: before it, its text put in the box to edit and
        send). The history is the same tokens, so the cache serves it (in RAM, or from disk
        after a restart): the branch's first reply computes only what is new."""
        if self.session is None:
            return
        try:
            messages = self._shown_messages()
            if not 0 <= index < len(messages):
                return
            message = messages[index]
            to_edit = edit or message.role == "user"
            branch = self.store.branch_session(
                self.session.id, message.seq - 1 if to_edit else message.seq
            )
        except StoreError as exc:
            self._set_state_text(f"Could not branch the chat: {exc}")
            return
        self.sessions.refresh(select_id=branch.id)
        self.open_session(branch.id)
        if to_edit:
            self.composer.set_text(message.content)
            self.composer.input.setFocus()
        self._set_state_text(
            "A branch of the chat: its shared history is served from the cache", 8000
        )

    def choose_version(self, index: int, version: int) -> None:
        """Show version ``version`` of the ``index``-th message (a regenerated reply): the
        chat goes on from it."""
        if self.session is None or self._busy(self.session.id):
            return
        try:
            message = self._shown_messages()[index]
            self.store.select_version(message.id, version)
        except (StoreError, IndexError) as exc:
            self._set_state_text(f"Could not show that version: {exc}")
            return
        self.open_session(self.session.id, reload=True)

    def show_model_card(self) -> None:
        info = self.bridge.model_info
        if info is None:
            self._set_state_text("No model is loaded yet")
            return
        dialog = ModelCardDialog(info, self._last_stats, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        self.model_card = dialog

    def _update_header(self) -> None:
        """The chat's header: its system prompt, the preset its settings are (if one is), its
        temperature; a link opens Chat Settings."""
        if self.session is None:
            self.chat_header.clear()
            return
        self.chat_header.setText(chat_header_text(self.session, self.sampling(), self.settings))
        self.chat_header.setToolTip(
            "System prompt: " + (self.session.system_prompt or "none (the model's own default)")
        )

    def sampling(self, session: Session | None = None) -> dict:
        """The sampling settings of ``session`` (default: the open chat)."""
        settings = dict(DEFAULT_SAMPLING)
        session = session if session is not None else self.session
        if session is not None:  # values stored out of range or unusable: clamped or default
            settings.update(usable(session.settings))
        return settings

    # ------------------------------------------------------------------ bridge slots
    def _on_load_progress(self, stage: str, fraction: float) -> None:
        percent = f" {fraction:.0%}" if fraction >= 0 else ""
        self._set_state_text(f"Loading the model: {stage}{percent}", 0)

    def _on_model_loading(self, spec: str) -> None:
        from core.models.catalog import describe_spec

        self._loading_spec = spec
        self._update_state()
        what = describe_spec(spec, self.bridge.data_root) if spec else "the model"
        self._set_state_text(f"Loading {what}…", 0)

    def _on_ready(self, name: str) -> None:
        self.model_name = name
        self._fallback_model = None  # only the first load falls back
        info = self.bridge.model_info
        if info is not None:
            self.settings.last_model = info.spec
        base = info is not None and info.base
        self.model_label.setText(f"{name} ({BASE_LABEL})" if base else name)
        self.model_action.setText(f"Model: {name}")
        self.chat.set_notice(base_model_notice(name) if base else "")
        self.context_bar.set_usage(self.context_bar.used, info.context_length if info else 0)
        self._update_title()
        if self.error_box is None or not self.error_box.isVisible():
            self._set_state_text("Ready", 0)
        self._update_state()

    def _on_load_failed(self, message: str) -> None:
        fallback, self._fallback_model = self._fallback_model, None
        if fallback and not self.model_name and fallback != self._loading_spec:
            gone = self._loading_spec
            self.settings.last_model = None
            self._show_box(
                QMessageBox.Icon.Information,
                f"The model you used last, {gone}, could not be loaded, so RadixChat starts "
                "on the default model.",
                message,
            )
            self.bridge.load_model(fallback)
            self._set_state_text(f"{gone} could not be loaded: loading the default model")
            return
        still = f" {self.model_name} stays loaded." if self.model_name else ""
        self._set_state_text(f"Could not load the model: {message}")
        self._show_box(QMessageBox.Icon.Warning, "Could not load the model." + still, message)
        self._update_state()

    def _show_box(self, icon: QMessageBox.Icon, text: str, details: str) -> None:
        self.error_box = QMessageBox(icon, "RadixChat", text, QMessageBox.StandardButton.Ok, self)
        self.error_box.setInformativeText(details)
        self.error_box.open()

    # ------------------------------------------------------------------ dialogs
    def choose_model(self) -> None:
        info = self.bridge.model_info
        dialog = ModelPickerDialog(
            self.bridge.data_root,
            info.spec if info is not None else None,
            self,
            downloads=self.downloads,
        )
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._load(dialog.chosen_spec()))
        dialog.open()
        self.model_dialog = dialog

    def open_downloads(self) -> None:
        if self.downloads_dialog is None:
            self.downloads_dialog = DownloadsDialog(self.downloads, self)
            self.downloads_dialog.loadRequested.connect(self._load)
        self.downloads_dialog.refresh()
        self.downloads_dialog.show()
        self.downloads_dialog.raise_()

    def _on_download_finished(self, target: str, spec: str) -> None:
        self._set_state_text(f"{spec} is downloaded: load it from Model… or Model › Downloads…")

    def _load(self, spec: str | None) -> None:
        if spec and not self.bridge.loading and not self._generating:
            self.bridge.load_model(spec)

    def edit_session_settings(self) -> None:
        if self.session is None:
            return
        dialog = SessionSettingsDialog(
            self.sampling(), self.session.system_prompt, self, presets=self.settings
        )
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        session_id = self.session.id  # the chat may change while the dialog is open
        dialog.accepted.connect(lambda: self._save_session_settings(*dialog.values(), session_id))
        dialog.open()
        self.settings_dialog = dialog

    def _save_session_settings(
        self, settings: dict, system_prompt: str | None, session_id: int | None = None
    ) -> None:
        session_id = session_id if session_id is not None else getattr(self.session, "id", None)
        if session_id is None:
            return
        try:
            stored = self.store.get_session_by_id(session_id)
            if stored is not None and CHAT_TOOLS in stored.settings:  # the Tools menu's
                settings = {**settings, CHAT_TOOLS: stored.settings[CHAT_TOOLS]}
            self.store.update_session(session_id, settings=settings, system_prompt=system_prompt)
            if self.session is not None and self.session.id == session_id:
                self.session = self.store.get_session_by_id(session_id) or self.session
        except StoreError as exc:
            self._set_state_text(f"Could not save the settings: {exc}")
            return
        self._update_header()
        self._set_state_text("Chat settings saved: they apply from the next reply", 5000)

    def edit_app_settings(self) -> None:
        dialog = AppSettingsDialog(
            self.settings,
            str(self.bridge.data_root),
            parent=self,
            pages=(("Tool Servers (MCP)", McpServersPage(self.tools)),),
        )
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._on_app_settings_saved(dialog.changed))
        dialog.open()
        self.app_dialog = dialog

    def _on_app_settings_saved(self, changed: list[str]) -> None:
        if changed:
            self._set_state_text(f"Restart RadixChat to use {', '.join(changed)}")

    # ------------------------------------------------------------------ helpers
    def _update_title(self) -> None:
        """The open chat's title (and the model's name when it is a base model), its header."""
        self._update_header()
        title = (self.session.title if self.session is not None else "") or "New chat"
        info = self.bridge.model_info
        if self.model_name and info is not None and info.base:
            title += f" — {self.model_name} ({BASE_LABEL})"
        self.setWindowTitle(f"{title} — RadixChat")

    def _update_state(self) -> None:
        session_id = self.session.id if self.session is not None else None
        busy = self._busy(session_id)
        ready = bool(self.model_name) and not self.bridge.loading and self.session is not None
        self.composer.set_state(ready=ready, generating=busy)
        waiting = self._waiting_in(session_id)
        self.composer.show_waiting(None if waiting is None or waiting.shown else waiting.text)
        self.chat.set_busy(busy or not ready)
        self.regenerate_action.setEnabled(ready and not busy)
        self.session_settings_action.setEnabled(self.session is not None)
        idle = not self._generating and not self._waiting
        self.model_action.setEnabled(idle and not self.bridge.loading)

    def _set_state_text(self, text: str, timeout_ms: int | None = None) -> None:
        """Say ``text`` in the status bar. A notice or an error goes after ``timeout_ms``
        (default ``STATUS_TIMEOUT_MS``), back to what the window is doing; 0: it stays until
        the next (what the engine is doing now: loading, reading the prompt, generating)."""
        self.state_label.setText(text)
        self._state_timer.stop()
        if timeout_ms != 0:
            self._state_timer.start(STATUS_TIMEOUT_MS if timeout_ms is None else timeout_ms)

    def _rest_state_text(self) -> None:
        """The status line once a notice has had its time: what the window is doing."""
        turn = self._turn
        if turn is not None:
            text = "Generating…" if self._visible(turn) else f"Generating in “{chat_title(turn)}”"
        elif self.bridge.loading:
            text = "Loading the model…"
        else:
            text = "Ready" if self.model_name else ""
        self.state_label.setText(text)
