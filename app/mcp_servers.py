"""The MCP servers page: the servers of ``mcp.json`` to add, edit, enable, disable, remove.

The same file and format as LM Studio's and Claude Desktop's (``{"mcpServers": {NAME:
{"command", "args", "env"} | {"url", "headers"}}}``), so a user can copy theirs into the
data folder, or add servers here. Secret values (an API key in a server's environment or
headers) go to the OS keychain where there is one (core.mcp.config.with_secret); the file
then says ``"keyring:"``. Saving applies the change to the running servers at once.
"""

from __future__ import annotations

import shlex

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from core.errors import UserError
from core.mcp.config import (
    KEYRING_VALUE,
    McpServer,
    delete_secrets,
    keyring_usable,
    save_servers,
    with_secret,
)
from core.mcp.tools import ServerStatus

COLUMNS = ("On", "Name", "Command or URL", "State")


def state_text(status: ServerStatus) -> str:
    """A server's state in a few words, for menus and the servers page."""
    if status.state == "ready":
        return f"{len(status.tools)} tool{'s' if len(status.tools) != 1 else ''}"
    if status.state == "failed":
        return f"failed: {status.error or 'no reason given'}"
    return {"starting": "starting…", "disabled": "disabled", "stopped": "stopped"}.get(
        status.state, status.state
    )


def _pairs(text: str, separator: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (``KEY: VALUE`` for headers) as a dict; a bad line: ValueError."""
    out = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition(separator)
        if not sep or not key.strip():
            raise ValueError(f"line {number} is not KEY{separator}VALUE: {line.strip()!r}")
        out[key.strip()] = value.strip()
    return out


class McpServerEditor(QDialog):
    """One server's settings. ``server``: the one to edit, or None for a new one."""

    def __init__(self, server: McpServer | None, taken: set[str], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Edit MCP Server" if server else "Add MCP Server")
        self.taken = taken
        self.original = server
        self.result_server: McpServer | None = None
        form = QFormLayout(self)
        self.name = QLineEdit(server.name if server else "")
        self.name.setPlaceholderText("files")
        form.addRow("Name:", self.name)
        self.command = QLineEdit(
            shlex.join([server.command or "", *server.args]) if server and not server.url else ""
        )
        self.command.setPlaceholderText("npx -y @modelcontextprotocol/server-filesystem ~/Notes")
        form.addRow("Command:", self.command)
        self.url = QLineEdit(server.url or "" if server else "")
        self.url.setPlaceholderText("or a streamable-HTTP URL: http://127.0.0.1:3001/mcp")
        form.addRow("URL:", self.url)
        plain_env = {k: v for k, v in (server.env if server else {}).items() if v != KEYRING_VALUE}
        self.env = QPlainTextEdit("\n".join(f"{k}={v}" for k, v in plain_env.items()))
        self.env.setPlaceholderText("KEY=VALUE, one a line")
        self.env.setMaximumHeight(70)
        form.addRow("Environment:", self.env)
        self.secrets = QPlainTextEdit()
        kept = [k for k, v in (server.env if server else {}).items() if v == KEYRING_VALUE]
        self.secrets.setPlaceholderText(
            "KEY=VALUE, one a line: "
            + (
                "kept in the system keychain"
                if keyring_usable()
                else "no keychain here: kept in mcp.json (mode 0600)"
            )
            + (f"; in the keychain now: {', '.join(kept)}" if kept else "")
        )
        self.secrets.setMaximumHeight(70)
        form.addRow("Secrets:", self.secrets)
        self.headers = QPlainTextEdit(
            "\n".join(f"{k}: {v}" for k, v in (server.headers if server else {}).items())
        )
        self.headers.setPlaceholderText("Header: value, one a line (an HTTP server's)")
        self.headers.setMaximumHeight(60)
        form.addRow("Headers:", self.headers)
        self.enabled = QCheckBox("Enabled")
        self.enabled.setChecked(server.enabled if server else True)
        form.addRow("", self.enabled)
        self.read_only = QCheckBox("Run its read-only tools without asking")
        self.read_only.setToolTip(
            "Tools the server marks read-only (readOnlyHint) run at once; others still ask"
        )
        self.read_only.setChecked(server.allow_read_only if server else False)
        form.addRow("", self.read_only)
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: palette(bright-text)")
        self.error.hide()
        form.addRow(self.error)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self._save)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        self.resize(620, self.sizeHint().height())

    def _save(self) -> None:
        try:
            self.result_server = self._server()
        except ValueError as exc:
            self.error.setText(str(exc))
            self.error.show()
            return
        self.accept()

    def _server(self) -> McpServer:
        name = self.name.text().strip()
        if not name:
            raise ValueError("give the server a name")
        if name in self.taken:
            raise ValueError(f"a server named {name!r} exists already")
        url, command = self.url.text().strip(), self.command.text().strip()
        if bool(url) == bool(command):
            raise ValueError("give a command or a URL (one of them)")
        if url and not url.startswith(("http://", "https://")):
            raise ValueError("the URL must start with http:// or https://")
        try:
            words = shlex.split(command) if command else []
        except ValueError as exc:
            raise ValueError(f"the command cannot be read: {exc}") from None
        env = _pairs(self.env.toPlainText(), "=")
        if self.original is not None:  # secrets kept in the keychain stay
            env |= {k: v for k, v in self.original.env.items() if v == KEYRING_VALUE}
        server = McpServer(
            name=name,
            command=words[0] if words else None,
            args=tuple(words[1:]),
            env=env,
            url=url or None,
            headers=_pairs(self.headers.toPlainText(), ":"),
            enabled=self.enabled.isChecked(),
            allow_read_only=self.read_only.isChecked(),
        )
        for key, value in _pairs(self.secrets.toPlainText(), "=").items():
            server, _in_keychain = with_secret(server, key, value)
        return server


class McpServersPage(QWidget):
    """The servers with their state; Add, Edit, Remove, Open Log; the On box enables or
    disables one. ``tools``: the window's :class:`app.window_tools.WindowTools`. A page of
    Preferences, and the Tools menu's MCP Servers… dialog."""

    def __init__(self, tools, parent: QWidget | None = None):
        super().__init__(parent)
        self.tools = tools
        column = QVBoxLayout(self)
        intro = QLabel(
            "Tool servers (Model Context Protocol) a chat can use: Tools › a server › Use in "
            f"This Chat. Kept in {tools.root / 'mcp.json'}, in the format LM Studio and "
            "Claude Desktop use. Servers run with your rights."
        )
        intro.setWordWrap(True)
        column.addWidget(intro)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.verticalHeader().hide()
        self.table.itemChanged.connect(self._on_item_changed)
        self.table.doubleClicked.connect(lambda _index: self.edit())
        column.addWidget(self.table, 1)
        row = QHBoxLayout()
        for text, slot in (
            ("Add…", self.add),
            ("Edit…", self.edit),
            ("Remove", self.remove),
            ("Open Log", self.open_log),
        ):
            button = QPushButton(text)
            button.clicked.connect(slot)
            row.addWidget(button)
        row.addStretch(1)
        column.addLayout(row)
        self.message = QLabel()
        self.message.setWordWrap(True)
        column.addWidget(self.message)
        tools.serversChanged.connect(self.refresh)
        self.refresh()

    @property
    def servers(self) -> list[McpServer]:
        return list(self.tools.servers)

    def refresh(self) -> None:
        statuses = {s.name: s for s in self.tools.statuses()}
        self.table.blockSignals(True)
        self.table.setRowCount(0)
        for server in self.servers:
            row = self.table.rowCount()
            self.table.insertRow(row)
            on = QTableWidgetItem()
            on.setFlags(Qt.ItemFlag.ItemIsUserCheckable | Qt.ItemFlag.ItemIsEnabled)
            on.setCheckState(Qt.CheckState.Checked if server.enabled else Qt.CheckState.Unchecked)
            self.table.setItem(row, 0, on)
            self.table.setItem(row, 1, QTableWidgetItem(server.name))
            self.table.setItem(row, 2, QTableWidgetItem(server.describe()))
            status = statuses.get(server.name)
            state = QTableWidgetItem(state_text(status) if status else "stopped")
            if status is not None and status.error:
                state.setToolTip(status.error)
            self.table.setItem(row, 3, state)
        self.table.resizeColumnsToContents()
        self.table.blockSignals(False)
        if self.tools.config_error:
            self.message.setText(self.tools.config_error)

    def selected(self) -> McpServer | None:
        row = self.table.currentRow()
        servers = self.servers
        return servers[row] if 0 <= row < len(servers) else None

    def add(self) -> None:
        editor = McpServerEditor(None, {s.name for s in self.servers}, self)
        if editor.exec() and editor.result_server is not None:
            self._save([*self.servers, editor.result_server])

    def edit(self) -> None:
        server = self.selected()
        if server is None:
            return
        taken = {s.name for s in self.servers} - {server.name}
        editor = McpServerEditor(server, taken, self)
        if editor.exec() and editor.result_server is not None:
            self._save([editor.result_server if s is server else s for s in self.servers])

    def remove(self) -> None:
        server = self.selected()
        if server is None:
            return
        answer = QMessageBox.question(
            self, "Remove MCP Server", f"Remove “{server.name}” (and its keychain secrets)?"
        )
        if answer == QMessageBox.StandardButton.Yes:
            delete_secrets(server)
            self._save([s for s in self.servers if s is not server])

    def open_log(self) -> None:
        server = self.selected()
        if server is not None:
            self.tools.open_log(server.name)

    def _on_item_changed(self, item: QTableWidgetItem) -> None:
        if item.column() != 0:
            return
        servers = self.servers
        if 0 <= item.row() < len(servers):
            from dataclasses import replace

            on = item.checkState() == Qt.CheckState.Checked
            servers[item.row()] = replace(servers[item.row()], enabled=on)
            self._save(servers)

    def _save(self, servers: list[McpServer]) -> None:
        try:
            path = save_servers(self.tools.root, servers)
        except (OSError, UserError) as exc:
            self.message.setText(f"Could not save mcp.json: {exc}")
            return
        self.tools.config_error = None
        self.tools.apply(tuple(servers))
        self.message.setText(f"Saved {path}")
        self.refresh()


class McpServersDialog(QDialog):
    """The servers page on its own (Tools › MCP Servers…)."""

    def __init__(self, tools, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("MCP Servers")
        column = QVBoxLayout(self)
        self.page = McpServersPage(tools, self)
        column.addWidget(self.page, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        column.addWidget(buttons)
        self.resize(760, 380)
