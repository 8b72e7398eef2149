"""The main window: sessions on the left, the chat in the middle, the live memory and cache
panels on the right; a toolbar for the model, the chat's settings and the API server.

The window only talks to the engine through its :class:`~app.bridge.EngineBridge`, and to
the chat history through a :class:`~core.chats.store.ChatStore`; it never blocks: replies,
model loads and server stops all come back as signals.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QSignalBlocker, Qt
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QLabel,
    QMainWindow,
    QMessageBox,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.bridge import EngineBridge
from app.cache_panel import CachePanel
from app.chat_view import ChatView
from app.composer import Composer
from app.group_bridge import GroupBridge
from app.group_dialog import GroupServeDialog
from app.memory_panel import MemoryPanel
from app.model_picker import ModelPickerDialog
from app.session_list import SessionList
from app.settings_dialogs import (
    DEFAULT_SAMPLING,
    AppSettings,
    AppSettingsDialog,
    SessionSettingsDialog,
)
from core.chats.store import ChatStore, Session, readable
from core.chats.turn import ChatTurn
from core.engine.types import RequestStats
from core.errors import StoreError, UserError
from core.paths import MB

log = logging.getLogger(__name__)


class MainWindow(QMainWindow):
    """``server_port``: where "Serve API" listens on 127.0.0.1 (0: any free port)."""

    def __init__(
        self,
        bridge: EngineBridge,
        store: ChatStore,
        settings: AppSettings | None = None,
        parent: QWidget | None = None,
        server_port: int = 8000,
    ):
        super().__init__(parent)
        self.bridge, self.store = bridge, store
        self.settings = settings if settings is not None else AppSettings()
        self.server_port = server_port
        self.model_name = ""
        self.session: Session | None = None
        self._turn: ChatTurn | None = None  # the turn whose reply the window waits for
        self._from_composer = False  # it came from the composer (not a regenerate)
        self.error_box: QMessageBox | None = None
        # serving over several Macs
        self.group_bridge = GroupBridge(str(bridge.data_root), parent=self)
        self.group_dialog: GroupServeDialog | None = None

        self.setWindowTitle("RadixChat")
        self.setUnifiedTitleAndToolBarOnMac(True)
        self.resize(1280, 800)
        self._build_widgets()
        self._build_actions()
        self._connect()
        self._restore_layout()
        self._open_initial_session()
        self._update_state()
        self._set_state_text("Loading the model…")

    # ------------------------------------------------------------------ layout
    def _build_widgets(self) -> None:
        self.sessions = SessionList(self.store)
        self.chat = ChatView()
        self.composer = Composer()
        middle = QWidget()
        column = QVBoxLayout(middle)
        column.setContentsMargins(8, 8, 8, 8)
        column.addWidget(self.chat, 1)
        column.addWidget(self.composer)
        self.memory_panel, self.cache_panel = MemoryPanel(), CachePanel()
        self.panels = QSplitter(Qt.Orientation.Vertical)
        self.panels.setObjectName("panelsSplitter")
        self.panels.addWidget(self.cache_panel)
        self.panels.addWidget(self.memory_panel)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("mainSplitter")
        self.splitter.addWidget(self.sessions)
        self.splitter.addWidget(middle)
        self.splitter.addWidget(self.panels)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([240, 640, 400])
        self.setCentralWidget(self.splitter)

        self.model_label = QLabel()
        self.state_label = QLabel()
        self.state_label.setContentsMargins(12, 0, 0, 0)
        self.speed_label = QLabel()
        self.server_label = QLabel()
        self.server_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.server_label.hide()
        bar = self.statusBar()
        bar.addWidget(self.model_label)
        bar.addWidget(self.state_label, 1)
        bar.addPermanentWidget(self.speed_label)
        bar.addPermanentWidget(self.server_label)

    def _build_actions(self) -> None:
        def action(text: str, slot, shortcut=None, tip: str = "") -> QAction:
            act = QAction(text, self)
            act.triggered.connect(slot)
            if shortcut is not None:
                act.setShortcut(QKeySequence(shortcut))
            act.setToolTip(tip or text)
            return act

        self.new_action = self.sessions.new_action  # Ctrl+N, window-wide; newRequested -> new_chat
        self.model_action = action("Model…", self.choose_model, "Ctrl+M", "Choose the model")
        self.session_settings_action = action(
            "Chat Settings…",
            self.edit_session_settings,
            "Ctrl+,",
            "System prompt and sampling for this chat",
        )
        self.app_settings_action = action(
            "Preferences…", self.edit_app_settings, None, "Data folder, memory and disk budgets"
        )
        self.app_settings_action.setMenuRole(QAction.MenuRole.PreferencesRole)
        self.regenerate_action = action("Regenerate Reply", self.regenerate, "Ctrl+R")
        self.stop_action = action(
            "Stop", self._on_escape, Qt.Key.Key_Escape, "Stop the reply (Esc)"
        )
        self.quit_action = action("Quit", self.close, QKeySequence.StandardKey.Quit)
        self.quit_action.setMenuRole(QAction.MenuRole.QuitRole)
        self.panels_action = action("Show Panels", self.panels.setVisible, "Ctrl+Shift+P")
        self.panels_action.setCheckable(True)
        self.panels_action.setChecked(True)
        self.serve_action = QAction("Serve API", self)
        self.serve_action.setCheckable(True)
        self.serve_action.setToolTip(
            "Serve the OpenAI-compatible API on 127.0.0.1"
            + (f":{self.server_port}" if self.server_port else "")
        )
        self.serve_action.toggled.connect(self._on_serve_toggled)
        self.group_action = action(
            "Serve Over Several Macs…",
            self.open_group_serve,
            None,
            "Serve the API with the model split over the Macs of a hostfile",
        )

        menus = self.menuBar()
        file_menu = menus.addMenu("&File")
        for act in (self.new_action, self.app_settings_action, self.quit_action):
            file_menu.addAction(act)
        chat_menu = menus.addMenu("&Chat")
        for act in (self.regenerate_action, self.stop_action, self.session_settings_action):
            chat_menu.addAction(act)
        menus.addMenu("&Model").addAction(self.model_action)
        server_menu = menus.addMenu("&Server")
        server_menu.addAction(self.serve_action)
        server_menu.addAction(self.group_action)
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

    def _connect(self) -> None:
        bridge = self.bridge
        bridge.loadProgress.connect(self._on_load_progress)
        bridge.modelLoading.connect(self._on_model_loading)
        bridge.modelReady.connect(self._on_ready)
        bridge.loadFailed.connect(self._on_load_failed)
        bridge.progress.connect(self._on_prefill_progress)
        bridge.token.connect(self._on_token)
        bridge.finished.connect(self._on_finished)
        bridge.failed.connect(self._on_failed)
        bridge.serverStopped.connect(self._on_server_stopped)
        self.group_bridge.serving.connect(
            lambda address: self._set_state_text(f"Group serving at {address}", 8000)
        )
        self.group_bridge.fault.connect(
            lambda message: self._set_state_text(f"The group broke: {message}")
        )
        bridge.statsUpdated.connect(self.memory_panel.update_stats)
        bridge.statsUpdated.connect(self.cache_panel.update_totals)
        self.composer.sendRequested.connect(self.send)
        self.composer.stopRequested.connect(bridge.cancel)
        self.composer.editCancelled.connect(lambda: self._set_state_text("Edit cancelled", 3000))
        self.chat.regenerateRequested.connect(self.regenerate)
        self.chat.editRequested.connect(self.composer.start_edit)
        self.sessions.sessionSelected.connect(self.open_session)
        self.sessions.sessionDeleted.connect(self._on_session_deleted)
        self.sessions.newRequested.connect(self.new_chat)

    def _restore_layout(self) -> None:
        geometry, state = self.settings.window_geometry, self.settings.window_state
        if geometry:
            self.restoreGeometry(geometry)
        if state:
            self.restoreState(state)
        if self.settings.splitter_state:
            self.splitter.restoreState(self.settings.splitter_state)

    def closeEvent(self, event: QCloseEvent) -> None:
        self.settings.window_geometry = bytes(self.saveGeometry().data())
        self.settings.window_state = bytes(self.saveState().data())
        self.settings.splitter_state = bytes(self.splitter.saveState().data())
        self.serve_action.setChecked(False)  # stops the API server (the app's exit waits for it)
        self.group_bridge.stop()  # and a group serving the API (run_app waits for it)
        if self._turn is not None:  # stop the reply and keep what came so far, as Stop does
            turn, self._turn = self._turn, None
            self.bridge.cancel()
            reply = self.chat.message_text(self.chat.message_count() - 1)
            if self.session is not None:
                try:
                    turn.finish(self.store, reply, None)  # nothing yet: nothing stored
                except StoreError as exc:
                    log.warning("the reply being written when the window closed is lost: %s", exc)
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
        """A fresh session (the current one is reused while it is still empty)."""
        if self._generating:
            return
        if self.session is not None and not self.chat.message_count():
            self.composer.input.setFocus()
            return
        settings = (
            dict(self.session.settings) if self.session is not None else dict(DEFAULT_SAMPLING)
        )
        system = self.session.system_prompt if self.session is not None else None
        try:
            session = self.store.create_session(settings=settings, system_prompt=system)
        except StoreError as exc:
            self._set_state_text(f"Could not create a chat: {exc}")
            return
        self.sessions.refresh(select_id=session.id)
        self.open_session(session.id)

    def open_session(self, session_id: int) -> None:
        if self._generating or (self.session is not None and self.session.id == session_id):
            if self.session is not None and self.sessions.current_id() != self.session.id:
                self.sessions.select(self.session.id)  # switching waits for the reply to end
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
        self.chat.set_messages([(m.role, m.content) for m in messages])
        self.cache_panel.set_turns([m.stats for m in messages if m.role == "assistant" and m.stats])
        if self.sessions.current_id() != session.id:
            self.sessions.select(session.id)
        self.setWindowTitle(f"{session.title or 'New chat'} — RadixChat")
        self._update_state()
        if damage or session.damaged:  # shown as read (bad bytes as U+FFFD), said in one row
            self.chat.add_error(f"Damaged: {damage or 'this chat: ' + session.damaged}")

    def _on_session_deleted(self, session_id: int, name: str) -> None:
        if name:
            self.bridge.forget_session(name)  # its cached KV, in RAM and on disk
        if self.session is not None and self.session.id == session_id:
            if self._turn is not None:  # its reply has nowhere to go
                self.bridge.cancel()
                self._turn = None
            self.session = None
            self._open_initial_session()

    def sampling(self) -> dict:
        settings = dict(DEFAULT_SAMPLING)
        if self.session is not None:
            settings.update(self.session.settings or {})
        return settings

    # ------------------------------------------------------------------ chatting
    def send(self, text: str) -> None:
        """Send ``text`` from the composer: a new turn, or (while editing) the last turn's
        replacement."""
        self._ask(text, replace=self.composer.editing, from_composer=True)

    def regenerate(self) -> None:
        """Ask again for the last reply: the new one replaces the last turn once it is done."""
        if self._generating or not self.model_name or self.session is None:
            return
        try:
            messages = readable(self.store.messages(self.session.id))[0]
        except StoreError as exc:
            self._set_state_text(f"Could not read the chat: {exc}")
            return
        if len(messages) < 2 or messages[-1].role != "assistant":
            return
        self._ask(messages[-2].content, replace=True, from_composer=False)

    def _ask(self, text: str, replace: bool, from_composer: bool) -> None:
        """Ask for a reply to ``text`` after the stored chat (less its last turn when
        ``replace``). The store only changes when the reply is done (``ChatTurn.finish``), so a
        reply that fails or is stopped before its first token loses nothing."""
        if (
            not text
            or self._generating
            or self.bridge.busy
            or not self.model_name
            or self.session is None
        ):
            return
        try:
            turn = ChatTurn.start(self.store, self.session, text, replace=replace)
        except StoreError as exc:
            self._set_state_text(f"Could not read the chat: {exc}")
            return
        messages = [(m.role, m.content) for m in turn.messages]
        try:
            # a bad setting raises here, before the window changes (events arrive queued)
            self.bridge.send(messages, self.sampling(), session=turn.session.name)
        except ValueError as exc:
            self._set_state_text(f"Check the chat settings: {exc}")
            return
        self._turn, self._from_composer = turn, from_composer
        if from_composer:
            self.composer.finish_edit()
            self.composer.input.clear()
        if replace or any(
            self.chat.message_role(i) == "error" for i in range(self.chat.message_count())
        ):
            self.chat.set_messages(messages[:-1])  # the chat as it will be stored (no error rows)
        self.chat.add_user_message(text)
        self.chat.begin_reply()
        self._update_state()
        self._set_state_text("Reading the prompt…")

    @property
    def _generating(self) -> bool:
        """The window waits for a reply."""
        return self._turn is not None

    def _give_back(self, turn: ChatTurn) -> None:
        """Undo the message sent in the window: the chat as stored, the text back in the
        composer."""
        if turn.replace:
            self.chat.set_messages([(m.role, m.content) for m in turn.stored])
        else:
            self.chat.remove_last_turn()
        if self._from_composer and not self.composer.text():  # nothing lost: it can be sent again
            if turn.replace:
                self.composer.start_edit(turn.prompt)
            else:
                self.composer.set_text(turn.prompt)

    def _on_escape(self) -> None:
        if self._generating:
            self.bridge.cancel()
        else:
            self.composer.cancel_edit()

    # ------------------------------------------------------------------ bridge slots
    def _on_load_progress(self, stage: str, fraction: float) -> None:
        percent = f" {fraction:.0%}" if fraction >= 0 else ""
        self._set_state_text(f"Loading the model: {stage}{percent}")

    def _on_model_loading(self, spec: str) -> None:
        from core.models.catalog import describe_spec

        self._update_state()
        what = describe_spec(spec, self.bridge.data_root) if spec else "the model"
        self._set_state_text(f"Loading {what}…")

    def _on_ready(self, name: str) -> None:
        self.model_name = name
        info = self.bridge.model_info
        if info is not None:
            self.settings.last_model = info.spec
        self.model_label.setText(name)
        self.model_action.setText(f"Model: {name}")
        self._set_state_text("Ready")
        self._update_state()

    def _on_load_failed(self, message: str) -> None:
        still = f" {self.model_name} stays loaded." if self.model_name else ""
        self._set_state_text(f"Could not load the model: {message}")
        self.error_box = QMessageBox(
            QMessageBox.Icon.Warning,
            "RadixChat",
            "Could not load the model." + still,
            QMessageBox.StandardButton.Ok,
            self,
        )
        self.error_box.setInformativeText(message)
        self.error_box.open()
        self._update_state()

    def _on_prefill_progress(self, done: int, total: int) -> None:
        if self._generating and done < total:
            self._set_state_text(f"Reading the prompt: {done} of {total} tokens")

    def _on_token(self, text: str) -> None:
        if self._generating:
            if self.state_label.text() != "Generating…":
                self._set_state_text("Generating…")
            self.chat.append_reply(text)

    def _on_finished(self, text: str, stats: RequestStats) -> None:
        turn, self._turn = self._turn, None
        if turn is None:  # a reply the window stopped waiting for (closed, chat deleted)
            self._update_state()
            return
        stopped = stats.finish_reason == "cancelled"
        if not turn.keeps(text, stats):  # stopped before its first token: as if it was never sent
            self._give_back(turn)
            self._set_state_text("Stopped before the reply began")
            self._update_state()
            return
        note = (
            f"{'stopped · ' if stopped else ''}{stats.completion_tokens} tokens · "
            f"{stats.decode_tps:.1f} tok/s · TTFT {stats.ttft_s:.2f} s"
        )
        self.chat.end_reply(text, note)
        self.cache_panel.set_turns(turn.kept_stats + [stats])
        served = stats.cached_tokens + stats.restored_tokens
        self.speed_label.setText(f"{stats.decode_tps:.1f} tok/s")
        self._set_state_text(
            f"{'Stopped' if stopped else 'Done'} · prompt {stats.prompt_tokens} tokens, "
            f"{served} from the cache · TTFT {stats.ttft_s:.2f} s"
        )
        self._update_state()
        if self.session is None:
            return
        saved = turn.save(self.store, text, stats, make_room=self.bridge.give_disk_space_back)
        if saved.error:  # the reply stays shown; the chat goes on in memory
            self._set_state_text(f"This reply is shown but was not saved: {saved.error}")
            return
        if saved.cache_freed:
            self._set_state_text(
                f"The disk is full: the KV cache ({saved.cache_freed / MB:.1f} MB) "
                "was deleted to save this reply"
            )
        try:
            self.session = self.store.get_session_by_id(self.session.id) or self.session
            self.sessions.refresh(select_id=self.session.id)
            self.setWindowTitle(f"{self.session.title or 'New chat'} — RadixChat")
        except StoreError as exc:
            self._set_state_text(f"Could not read the chats: {exc}")

    def _on_failed(self, message: str) -> None:
        turn, self._turn = self._turn, None
        if turn is None:
            self._update_state()
            return
        self._give_back(turn)
        self.chat.add_error(message)
        self._set_state_text(f"Error: {message}")
        self._update_state()

    # ------------------------------------------------------------------ dialogs
    def choose_model(self) -> None:
        info = self.bridge.model_info
        dialog = ModelPickerDialog(
            self.bridge.data_root, info.spec if info is not None else None, self
        )
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._load(dialog.chosen_spec()))
        dialog.open()
        self.model_dialog = dialog

    def _load(self, spec: str | None) -> None:
        if spec and not self.bridge.loading:
            self.bridge.load_model(spec)

    def edit_session_settings(self) -> None:
        if self.session is None:
            return
        dialog = SessionSettingsDialog(self.sampling(), self.session.system_prompt, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._save_session_settings(*dialog.values()))
        dialog.open()
        self.settings_dialog = dialog

    def _save_session_settings(self, settings: dict, system_prompt: str | None) -> None:
        if self.session is None:
            return
        try:
            self.store.update_session(
                self.session.id, settings=settings, system_prompt=system_prompt
            )
            self.session = self.store.get_session_by_id(self.session.id) or self.session
        except StoreError as exc:
            self._set_state_text(f"Could not save the settings: {exc}")

    def edit_app_settings(self) -> None:
        dialog = AppSettingsDialog(self.settings, str(self.bridge.data_root), parent=self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(dialog.apply)
        dialog.open()
        self.app_dialog = dialog

    # ------------------------------------------------------------------ server
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
            self._set_state_text(f"Could not start the API server: {exc}")
            return
        self.server_label.setText(f"API: {address}")
        self.server_label.show()

    def open_group_serve(self) -> None:
        """The Serve settings for a group of Macs (the model: the one loaded now)."""
        info = self.bridge.model_info
        if info is None:
            self._set_state_text(
                "Wait for the model to load, then serve it over several Macs", 5000
            )
            return
        if self.group_dialog is not None:
            self.group_dialog.raise_()
            self.group_dialog.activateWindow()
            return
        dialog = GroupServeDialog(
            self.group_bridge,
            info.name,
            info.path,
            self.settings.group_hostfile or "",
            self.server_port or 8000,
            parent=self,
        )
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        # the hostfile a group was started with: offered next time
        dialog.start_button.clicked.connect(
            lambda: setattr(self.settings, "group_hostfile", dialog.hostfile.text().strip() or None)
        )
        dialog.destroyed.connect(lambda: setattr(self, "group_dialog", None))
        dialog.show()
        self.group_dialog = dialog

    def _on_server_stopped(self) -> None:
        self.server_label.hide()
        self.serve_action.setEnabled(True)
        self._set_state_text("API server stopped", 5000)

    # ------------------------------------------------------------------ helpers
    def _update_state(self) -> None:
        ready = (
            bool(self.model_name)
            and not self.bridge.loading
            and not self.bridge.busy
            and self.session is not None
        )
        self.composer.set_state(ready=ready, generating=self._generating)
        self.chat.set_busy(self._generating or not ready)
        idle = not self._generating
        for act in (self.new_action, self.regenerate_action, self.session_settings_action):
            act.setEnabled(idle)
        self.regenerate_action.setEnabled(idle and ready)
        self.model_action.setEnabled(idle and not self.bridge.loading)
        self.sessions.setEnabled(idle)

    def _set_state_text(self, text: str, timeout_ms: int = 0) -> None:
        self.state_label.setText(text)
