"""The window's tools: the MCP servers of ``mcp.json`` and which of them each chat uses.

:class:`WindowTools` owns the app's :class:`~core.mcp.hub.McpHub` (servers start with the
window and stop with it), the Tools menu and the :class:`~app.tool_loop.ToolLoop` of the
running reply. A chat's choice lives in its settings under ``"tools"``::

    {"servers": {NAME: None (all its tools) | [tool, ...]},
     "allowed": ["server/tool", ...],      # Allow for This Chat
     "max_steps": 8,                        # the loop's limit of steps
     "first": "auto" | "required" | TOOL}   # the first step: the model decides, must call

The first time a chat turns a server on, a dialog says what the server can do (its tools)
and that it runs with the user's rights; the answer is kept (Preferences' page lists it). A
server that fails shows its error in the status line and in the menu; the chat goes on.
"""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, QUrl, Signal
from PySide6.QtGui import QAction, QActionGroup, QDesktopServices
from PySide6.QtWidgets import QMenu, QMessageBox, QWidget

from app.mcp_servers import McpServersDialog, state_text
from app.tool_loop import LoopState, ToolLoop
from core.errors import StoreError, UserError
from core.mcp.config import McpServer, load_servers
from core.mcp.hub import McpHub
from core.mcp.tools import ServerStatus

CHAT_KEY = "tools"
DEFAULT_MAX_STEPS = 8
STEP_LIMITS = (1, 2, 4, 8, 16, 32)
STATUS_POLL_MS = 2000


def chat_tools(settings: dict) -> dict:
    """A chat's ``"tools"`` setting in its full shape (what is missing or wrong: the
    default; a chat that never chose uses no server)."""
    value = settings.get(CHAT_KEY) if isinstance(settings, dict) else None
    value = value if isinstance(value, dict) else {}
    servers = value.get("servers") if isinstance(value.get("servers"), dict) else {}
    servers = {
        str(name): (None if tools is None else [str(t) for t in tools])
        for name, tools in servers.items()
        if tools is None or isinstance(tools, list)
    }
    allowed = [str(a) for a in value.get("allowed", []) if isinstance(a, str)]
    steps = value.get("max_steps")
    steps = steps if isinstance(steps, int) and 1 <= steps <= 100 else DEFAULT_MAX_STEPS
    first = value.get("first") if isinstance(value.get("first"), str) else "auto"
    return {"servers": servers, "allowed": allowed, "max_steps": steps, "first": first}


def first_line(tool) -> str:
    """A tool's description's first line (its title's if none), cut at 120 characters."""
    text = (tool.description or tool.title or "").strip()
    return text.splitlines()[0][:120] if text else ""


class WindowTools(QObject):
    """The hub, the Tools menu and the loop (see the module docstring). ``store``: the
    chats' ChatStore; ``settings``: the app's AppSettings (the servers the user accepted);
    ``chat()``: the open chat's session (or None); ``say(text)``: a status bar line."""

    serversChanged = Signal()  # the configuration or a server's state changed
    chatChanged = Signal(int)  # a chat's tool settings were saved (its id)

    def __init__(self, window: QWidget, root: Path, store, settings, chat, say, parent=None):
        super().__init__(parent or window)
        self.window, self.root, self.store = window, Path(root), store
        self.settings = settings  # app.settings_dialogs.AppSettings
        self._chat, self._say = chat, say
        self.config_error: str | None = None
        servers = self._load()
        self._configured = servers  # what mcp.json says now (the hub follows on a thread)
        self.hub = McpHub(self.root, servers)
        self.loop = ToolLoop(self.hub, self._allow_for_chat, self)
        self._states: dict[str, str] = {}
        self.menu = QMenu("&Tools", window)
        self.menu.setToolTipsVisible(True)
        self.menu.aboutToShow.connect(self._fill_menu)
        self.servers_action = QAction("MCP Servers…", window)
        self.servers_action.setToolTip("Add, edit, enable or disable MCP tool servers")
        self.servers_action.triggered.connect(self.open_servers)
        self._poll = QTimer(self)
        self._poll.timeout.connect(self._check_states)
        if servers:
            self.hub.start()
        self._poll.start(STATUS_POLL_MS)
        if self.config_error:
            QTimer.singleShot(0, lambda: self._say(self.config_error))

    # ------------------------------------------------------------------ servers
    @property
    def servers(self) -> tuple[McpServer, ...]:
        return self._configured

    def statuses(self) -> tuple[ServerStatus, ...]:
        return self.hub.statuses()

    def apply(self, servers: tuple[McpServer, ...]) -> None:
        """A changed configuration (the servers page saved it): applied off the GUI thread
        (stopping a server can take seconds)."""
        self._configured = tuple(servers)

        def work() -> None:
            if not self.hub.running:  # nothing ran yet
                self.hub.reload(servers)
                if any(s.enabled for s in servers):
                    self.hub.start()
            else:
                self.hub.reload(servers)

        threading.Thread(target=work, name="radixchat-mcp-reload", daemon=True).start()
        self.serversChanged.emit()

    def shutdown(self) -> None:
        """Stop every server (the window closes)."""
        self._poll.stop()
        handle = self.loop.state.handle if self.loop.state is not None else None
        if handle is not None:
            handle.cancel()
        self.hub.stop()

    def open_servers(self) -> None:
        McpServersDialog(self, self.window).exec()

    def open_log(self, name: str) -> None:
        path = self.hub.log_file(name)
        if not path.exists():
            self._say(f"MCP server {name} has written no log yet ({path})")
            return
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))

    def acknowledged(self) -> set[str]:
        return self.settings.mcp_acknowledged

    # ------------------------------------------------------------------ a chat
    def loop_state(self, session) -> LoopState | None:
        """The loop a reply in ``session`` runs with: None when the chat uses no server or
        none of its servers has tools ready (said in the status line)."""
        choice = chat_tools(session.settings)
        if not choice["servers"]:
            return None
        enabled = {
            name: (None if tools is None else set(tools))
            for name, tools in choice["servers"].items()
        }
        table = self.hub.tools(enabled)
        if not table.specs:
            waiting = ", ".join(
                f"{s.name} ({state_text(s)})" for s in self.statuses() if s.name in enabled
            )
            self._say(f"No tools ready in this chat's servers: {waiting or 'none configured'}")
            return None
        configs = {s.name: s for s in self.servers}
        read_only = {
            (s.name, t.name)
            for s in self.statuses()
            if s.name in enabled and configs.get(s.name) and configs[s.name].allow_read_only
            for t in s.tools
            if t.read_only
        }
        return LoopState(
            session_id=session.id,
            table=table,
            read_only=read_only,
            allowed=set(choice["allowed"]),
            max_steps=choice["max_steps"],
        )

    def request_args(self, session, step: int) -> dict:
        """The tools to send with step ``step`` (0: the first) of a reply, as
        ``EngineBridge.send`` takes them: the same specs at every step (so each step's
        prompt extends the last), the chat's choice of first step."""
        state = self.loop.state
        if state is None:
            return {}
        args = {"tools": state.table.specs}
        first = chat_tools(session.settings)["first"]
        if step == 0 and first == "required":
            args["tool_choice"] = "required"
        elif step == 0 and first not in ("auto", "required") and first in state.table.routes:
            args["tool_choice"], args["tool_name"] = "function", first
        return args

    def set_chat_tools(self, session, choice: dict) -> None:
        """Store ``choice`` as ``session``'s tools (read again first: the rest of its
        settings stay as stored)."""
        try:
            stored = self.store.get_session_by_id(session.id) or session
            self.store.update_session(session.id, settings={**stored.settings, CHAT_KEY: choice})
        except StoreError as exc:
            self._say(f"Could not save the chat's tools: {exc}")
            return
        self.chatChanged.emit(session.id)

    def use_server(self, session, name: str, tools: list[str] | None, on: bool) -> bool:
        """Turn server ``name`` on (``tools``: all, None, or those) or off in ``session``;
        the first time, only once the user has seen what it can do. False: not changed."""
        choice = chat_tools(session.settings)
        if on and name not in self.acknowledged() and not self._first_use(name):
            return False
        if on:
            choice["servers"][name] = tools
        else:
            choice["servers"].pop(name, None)
        self.set_chat_tools(session, choice)
        return True

    def _first_use(self, name: str) -> bool:
        """Say what server ``name`` can do before a chat first uses it; True when accepted."""
        status = self.hub.status(name)
        config = next((s for s in self.servers if s.name == name), None)
        if status is not None and status.tools:
            listing = "\n".join(
                f"• {t.name}{' (read-only)' if t.read_only else ''}: {first_line(t)}"
                for t in status.tools
            )
        else:
            state = state_text(status) if status is not None else "not running"
            listing = f"(its tools are not known yet: {state})"
        box = QMessageBox(self.window)
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle(f"Use the tools of {name}?")
        box.setText(
            f"“{name}” runs with your rights ({config.describe() if config else 'unknown'}). "
            "The model may ask to call these tools; each call shows its arguments and waits "
            "for your Allow unless you allow it for the chat:"
        )
        box.setInformativeText(listing)
        box.setStandardButtons(QMessageBox.StandardButton.Ok | QMessageBox.StandardButton.Cancel)
        box.button(QMessageBox.StandardButton.Ok).setText("Use Its Tools")
        if box.exec() != QMessageBox.StandardButton.Ok:
            return False
        self.settings.mcp_acknowledged = self.acknowledged() | {name}
        return True

    def _allow_for_chat(self, session_id: int, key: str) -> None:
        session = self._chat_by_id(session_id)
        if session is None:
            return
        choice = chat_tools(session.settings)
        if key not in choice["allowed"]:
            choice["allowed"].append(key)
        self.set_chat_tools(session, choice)

    def _chat_by_id(self, session_id: int):
        try:
            return self.store.get_session_by_id(session_id)
        except StoreError:
            return None

    # ------------------------------------------------------------------ menu
    def _fill_menu(self) -> None:
        menu = self.menu
        menu.clear()
        session = self._chat()
        choice = chat_tools(session.settings) if session is not None else None
        statuses = self.statuses()
        if not statuses:
            empty = menu.addAction(
                "No MCP servers yet" if not self.config_error else "mcp.json cannot be read"
            )
            empty.setEnabled(False)
        for status in statuses:
            self._server_menu(menu, status, session, choice)
        menu.addSeparator()
        if session is not None:
            self._limit_menu(menu, session, choice)
            self._first_menu(menu, session, choice)
        menu.addSeparator()
        menu.addAction(self.servers_action)

    def _server_menu(self, menu: QMenu, status: ServerStatus, session, choice) -> None:
        sub = menu.addMenu(f"{status.name} — {state_text(status)}")
        used = choice is not None and status.name in choice["servers"]
        chosen = choice["servers"].get(status.name) if used else None
        whole = sub.addAction("Use in This Chat")
        whole.setCheckable(True)
        whole.setChecked(used)
        whole.setEnabled(session is not None and status.state != "disabled")
        whole.toggled.connect(lambda on, n=status.name: self.use_server(self._chat(), n, None, on))
        if status.tools:
            sub.addSeparator()
        names = [t.name for t in status.tools]
        for tool in status.tools:
            act = sub.addAction(tool.name + (" (read-only)" if tool.read_only else ""))
            act.setToolTip(tool.description)
            act.setCheckable(True)
            act.setChecked(used and (chosen is None or tool.name in chosen))
            act.setEnabled(session is not None)
            act.toggled.connect(
                lambda on, n=status.name, t=tool.name: self._toggle_tool(n, t, names, on)
            )
        sub.addSeparator()
        log = sub.addAction("Open Server Log")
        log.triggered.connect(lambda _=False, n=status.name: self.open_log(n))

    def _toggle_tool(self, server: str, tool: str, names: list[str], on: bool) -> None:
        session = self._chat()
        if session is None:
            return
        choice = chat_tools(session.settings)
        current = choice["servers"].get(server, [] if server not in choice["servers"] else None)
        chosen = set(names if current is None else current)
        chosen = chosen | {tool} if on else chosen - {tool}
        tools = None if chosen >= set(names) else [n for n in names if n in chosen]
        self.use_server(session, server, tools, bool(chosen))

    def _limit_menu(self, menu: QMenu, session, choice) -> None:
        sub = menu.addMenu("Step Limit")
        sub.setToolTipsVisible(True)
        group = QActionGroup(sub)
        for limit in STEP_LIMITS:
            act = sub.addAction(f"{limit} step{'s' if limit > 1 else ''}")
            act.setCheckable(True)
            act.setChecked(choice["max_steps"] == limit)
            group.addAction(act)
            act.triggered.connect(lambda _=False, n=limit: self._set(session, "max_steps", n))

    def _first_menu(self, menu: QMenu, session, choice) -> None:
        sub = menu.addMenu("First Step")
        group = QActionGroup(sub)
        options = [("auto", "The Model Decides"), ("required", "Must Call a Tool")]
        enabled = {
            name: (None if tools is None else set(tools))
            for name, tools in choice["servers"].items()
        }
        options += [(name, f"Must Call {name}") for name in self.hub.tools(enabled).routes]
        for value, label in options:
            act = sub.addAction(label)
            act.setCheckable(True)
            act.setChecked(choice["first"] == value)
            group.addAction(act)
            act.triggered.connect(lambda _=False, v=value: self._set(session, "first", v))

    def _set(self, session, key: str, value) -> None:
        session = self._chat_by_id(session.id) or session
        self.set_chat_tools(session, {**chat_tools(session.settings), key: value})

    def _check_states(self) -> None:
        """Say in the status line when a server fails (once per failure)."""
        changed = False
        for status in self.statuses():
            before = self._states.get(status.name)
            if before != status.state:
                changed = True
                if status.state == "failed":
                    self._say(f"MCP server {status.name} {state_text(status)}")
            self._states[status.name] = status.state
        if changed:
            self.serversChanged.emit()

    def _load(self) -> tuple[McpServer, ...]:
        try:
            return load_servers(self.root)
        except UserError as exc:
            self.config_error = str(exc)
            return ()
