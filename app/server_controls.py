"""Serving the API from the app: the Server menu's actions, their settings and the request log.

``ServerControls`` owns "Serve API" (on/off), "API Settings…" (port, Ollama's port, keys,
allowed origins, the local network), "API Request Log…" (the last requests with their
dialect, tokens, cached tokens and time to first token) and "Serve Over Several Macs…",
and the status bar's address. It reaches the engine only through the window's
:class:`~app.bridge.EngineBridge`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from PySide6.QtCore import QObject, QSignalBlocker, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMainWindow,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.bridge import EngineBridge
from app.group_bridge import GroupBridge
from app.group_dialog import GroupServeDialog
from app.settings_dialogs import OLLAMA_PORT, AppSettings
from core.api.guard import normalize_origin
from core.api.request_log import LoggedRequest
from core.errors import UserError

LOOPBACK, EVERY_INTERFACE = "127.0.0.1", "0.0.0.0"
LOG_COLUMNS = ("Time", "Dialect", "Prompt", "Cached", "Reply", "First token", "Result")
DIALECT_NAMES = {"openai": "OpenAI", "anthropic": "Anthropic", "ollama": "Ollama"}


def _lines(edit: QPlainTextEdit) -> list[str]:
    return [line.strip() for line in edit.toPlainText().splitlines() if line.strip()]


class ApiSettingsDialog(QDialog):
    """Port, API keys, allowed origins and the local network; OK writes them into the
    settings (a bad origin, or the network without a key, is said in one line and kept
    open). They apply the next time "Serve API" starts."""

    def __init__(self, settings: AppSettings, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("API settings")
        self.settings = settings
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setSpecialValueText("any free port")
        self.port.setValue(settings.api_port)
        self.port.setToolTip(
            "The TCP port the API listens on (OpenAI, Anthropic and Ollama clients)"
        )
        self.ollama = QCheckBox(f"Also listen on Ollama's port ({OLLAMA_PORT}) or:")
        self.ollama.setToolTip(
            "Apps that speak only Ollama's API (Open WebUI, Continue, Raycast...) look for it "
            f"on port {OLLAMA_PORT}: the same API is served there too (quit Ollama first)"
        )
        self.ollama_port = QSpinBox()
        self.ollama_port.setRange(1, 65535)
        self.ollama_port.setValue(settings.api_ollama_port or OLLAMA_PORT)
        self.ollama.setChecked(settings.api_ollama_port is not None)
        self.ollama_port.setEnabled(self.ollama.isChecked())
        self.ollama.toggled.connect(self.ollama_port.setEnabled)
        ollama_row = QHBoxLayout()
        ollama_row.addWidget(self.ollama)
        ollama_row.addWidget(self.ollama_port)
        ollama_row.addStretch(1)
        self.on_network = QCheckBox("Serve other machines on the network (needs an API key)")
        self.on_network.setChecked(settings.api_on_network)
        self.keys = QPlainTextEdit("\n".join(settings.api_keys))
        self.keys.setPlaceholderText("No key: any program on this machine may call the API")
        self.keys.setToolTip(
            "One key a line. Clients send it as Authorization: Bearer KEY or x-api-key; "
            "each key's requests share cached prompts only among themselves"
        )
        self.generate_button = QPushButton("Add a New Key")
        self.generate_button.clicked.connect(self.add_key)
        self.origins = QPlainTextEdit("\n".join(settings.api_origins))
        self.origins.setPlaceholderText("None: web pages cannot call the API")
        self.origins.setToolTip(
            "Web pages allowed to call the API from a browser, one a line, like "
            "http://localhost:3000 (* allows any)"
        )
        for edit in (self.keys, self.origins):
            edit.setFixedHeight(edit.fontMetrics().lineSpacing() * 4 + 12)
        self.error_label = QLabel()
        self.error_label.setStyleSheet("color: #c0392b;")
        self.error_label.setWordWrap(True)
        self.error_label.hide()
        form = QFormLayout()
        form.addRow("Port:", self.port)
        form.addRow("", ollama_row)
        form.addRow("", self.on_network)
        form.addRow("API keys:", self.keys)
        form.addRow("", self.generate_button)
        form.addRow("Allowed origins:", self.origins)
        note = QLabel("These apply the next time Serve API starts.")
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.buttons = buttons
        column = QVBoxLayout(self)
        column.addLayout(form)
        column.addWidget(note)
        column.addWidget(self.error_label)
        column.addWidget(buttons)
        self.resize(520, self.sizeHint().height())

    def add_key(self) -> None:
        """A new random key on a line of its own."""
        self.keys.setPlainText("\n".join([*_lines(self.keys), f"rc-{secrets.token_urlsafe(24)}"]))

    def accept(self) -> None:
        keys = _lines(self.keys)
        try:
            origins = [normalize_origin(origin) for origin in _lines(self.origins)]
        except ValueError as exc:
            return self._refuse(f"Allowed origins: {exc}")
        if self.on_network.isChecked() and not keys:
            return self._refuse("Serving other machines needs an API key: add one")
        ollama_port = self.ollama_port.value() if self.ollama.isChecked() else None
        if ollama_port is not None and ollama_port == self.port.value():
            return self._refuse("Ollama's port must differ from the API's port")
        self.settings.api_port = self.port.value()
        self.settings.api_ollama_port = ollama_port
        self.settings.api_on_network = self.on_network.isChecked()
        self.settings.api_keys = keys
        self.settings.api_origins = origins
        self.settings.sync()
        super().accept()

    def _refuse(self, message: str) -> None:
        self.error_label.setText(message)
        self.error_label.show()


class RequestLogDialog(QDialog):
    """The last requests the API served, newest first; ``show_requests`` refreshes it."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("API request log")
        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(LOG_COLUMNS))
        self.tree.setHeaderLabels(LOG_COLUMNS)
        self.tree.setRootIsDecorated(False)
        self.tree.setUniformRowHeights(True)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        for column, tip in (
            (2, "Prompt tokens"),
            (3, "Prompt tokens the cache served (RAM + disk), so they were not computed"),
            (4, "Tokens generated"),
            (5, "From the request's arrival to its first token, waiting included"),
        ):
            self.tree.headerItem().setToolTip(column, tip)
        header = self.tree.header()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.empty = QLabel("No request yet: the API's requests show here as they end.")
        column = QVBoxLayout(self)
        column.addWidget(self.empty)
        column.addWidget(self.tree, 1)
        self.shown: tuple[LoggedRequest, ...] = ()
        self.resize(720, 360)

    def show_requests(self, requests: tuple[LoggedRequest, ...]) -> None:
        if requests == self.shown:
            return
        self.shown = requests
        self.empty.setVisible(not requests)
        self.tree.clear()
        for entry in reversed(requests):
            if entry.error and entry.status >= 400:  # refused before the engine saw it
                result = f"refused {entry.status}: {entry.error}"
            else:
                result = f"error: {entry.error}" if entry.error else entry.finish_reason
            row = QTreeWidgetItem(
                [
                    time.strftime("%H:%M:%S", time.localtime(entry.at)),
                    DIALECT_NAMES.get(entry.dialect, entry.dialect),
                    f"{entry.prompt_tokens:,}",
                    f"{entry.served_tokens:,}",
                    f"{entry.completion_tokens:,}",
                    "" if entry.error else f"{entry.ttft_s:.2f} s",
                    result,
                ]
            )
            row.setToolTip(1, entry.path)
            row.setToolTip(
                3, f"{entry.cached_tokens:,} from RAM, {entry.restored_tokens:,} from disk"
            )
            for col in range(2, 6):
                row.setTextAlignment(
                    col, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
                )
            self.tree.addTopLevelItem(row)


class ServerControls(QObject):
    """The Server menu of ``window``; ``say(text, ms)`` puts a line in its status bar.
    ``port_override``: a port to use instead of the settings' (tests: 0, any free port)."""

    def __init__(
        self,
        window: QMainWindow,
        bridge: EngineBridge,
        settings: AppSettings,
        say: Callable[..., None],
        port_override: int | None = None,
    ):
        super().__init__(window)
        self.window, self.bridge, self.settings, self.say = window, bridge, settings, say
        self.port_override = port_override
        self.group_bridge = GroupBridge(str(bridge.data_root), parent=self)
        self.group_dialog: GroupServeDialog | None = None
        self.settings_dialog: ApiSettingsDialog | None = None
        self.log_dialog: RequestLogDialog | None = None

        self.serve_action = QAction("Serve API", window)
        self.serve_action.setCheckable(True)
        self.serve_action.setShortcut(QKeySequence("Ctrl+Shift+S"))
        self.serve_action.toggled.connect(self._on_serve_toggled)
        self.settings_action = QAction("API Settings…", window)
        self.settings_action.setToolTip("Port, API keys, allowed origins")
        self.settings_action.setShortcut(QKeySequence("Ctrl+Shift+A"))
        self.settings_action.triggered.connect(self.edit_settings)
        self.log_action = QAction("API Request Log…", window)
        self.log_action.setToolTip("The last requests served: tokens, cached tokens, TTFT")
        self.log_action.setShortcut(QKeySequence("Ctrl+Shift+L"))
        self.log_action.triggered.connect(self.open_log)
        self.group_action = QAction("Serve Over Several Macs…", window)
        self.group_action.setToolTip(
            "Serve the API with the model split over the Macs of a hostfile"
        )
        self.group_action.setShortcut(QKeySequence("Ctrl+Shift+G"))
        self.group_action.triggered.connect(self.open_group_serve)
        self.label = QLabel()
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.label.hide()
        self._update_tip()
        bridge.serverStopped.connect(self._on_server_stopped)
        bridge.statsUpdated.connect(self._refresh_log)
        self.group_bridge.serving.connect(
            lambda address: self.say(f"Group serving at {address}", 8000)
        )
        self.group_bridge.fault.connect(lambda message: self.say(f"The group broke: {message}"))

    @property
    def port(self) -> int:
        return self.settings.api_port if self.port_override is None else self.port_override

    def actions(self) -> tuple[QAction, ...]:
        return (self.serve_action, self.settings_action, self.log_action, self.group_action)

    def edit_settings(self) -> None:
        dialog = ApiSettingsDialog(self.settings, self.window)
        if self.port_override is not None:
            dialog.port.setValue(self.port_override)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(self._on_settings_saved)
        dialog.open()
        self.settings_dialog = dialog

    def open_log(self) -> None:
        if self.log_dialog is None:
            self.log_dialog = RequestLogDialog(self.window)
        self.log_dialog.show_requests(self.bridge.recent_requests())
        self.log_dialog.show()
        self.log_dialog.raise_()

    def stop(self) -> None:
        """Stop serving (the window closes): the API server and a group serving it."""
        self.serve_action.setChecked(False)
        self.group_bridge.stop()

    # -- slots --

    def _on_settings_saved(self) -> None:
        self.port_override = None  # the port chosen here from now on
        self._update_tip()
        running = self.bridge.server_address is not None
        self.say(
            "API settings saved" + (": stop and start Serve API to use them" if running else "")
        )

    def _on_serve_toggled(self, on: bool) -> None:
        if not on:
            self.serve_action.setEnabled(False)  # until the port is free again
            self.label.setText("API: stopping…")
            self.bridge.stop_server()
            return
        host = EVERY_INTERFACE if self.settings.api_on_network else LOOPBACK
        try:
            address = self.bridge.start_server(
                self.port,
                tuple(self.settings.api_keys),
                tuple(self.settings.api_origins),
                host,
                self.settings.api_ollama_port,
            )
        except UserError as exc:
            with QSignalBlocker(self.serve_action):
                self.serve_action.setChecked(False)
            self.say(f"Could not start the API server: {exc}")
            return
        keyed = " · key needed" if self.settings.api_keys else ""
        ollama = self.bridge.server_ollama_address
        also = f" · Ollama: {ollama}" if ollama else ""
        self.label.setText(f"API: {address}{also}{keyed}")
        self.label.show()

    def _on_server_stopped(self) -> None:
        self.label.hide()
        self.serve_action.setEnabled(True)
        self.say("API server stopped", 5000)

    def _refresh_log(self, _stats=None) -> None:
        if self.log_dialog is not None and self.log_dialog.isVisible():
            self.log_dialog.show_requests(self.bridge.recent_requests())

    def open_group_serve(self) -> None:
        """The Serve settings for a group of Macs (the model: the one loaded now)."""
        info = self.bridge.model_info
        if info is None:
            self.say("Wait for the model to load, then serve it over several Macs", 5000)
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
            self.port or 8000,
            parent=self.window,
        )
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        # the hostfile a group was started with: offered next time
        dialog.start_button.clicked.connect(
            lambda: setattr(self.settings, "group_hostfile", dialog.hostfile.text().strip() or None)
        )
        dialog.destroyed.connect(lambda: setattr(self, "group_dialog", None))
        dialog.show()
        self.group_dialog = dialog

    def _update_tip(self) -> None:
        where = "every network interface" if self.settings.api_on_network else LOOPBACK
        port = f":{self.port}" if self.port else ""
        self.serve_action.setToolTip(
            f"Serve the OpenAI-, Anthropic- and Ollama-compatible API on {where}{port}"
        )
