"""The app's line to a group of machines serving one model (``radixchat serve --hosts``).

The group runs as a child process (:class:`core.distributed.group_server.GroupServer`),
not in the app's engine: every rank, rank 0 included, loads its own part of the model.
This bridge checks a hostfile against a model off the GUI thread, starts and stops the
group, and turns what the group reports (from its watching thread) into Qt signals on the
GUI thread, carrying plain values only.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from PySide6.QtCore import QObject, Qt, Signal

from core.distributed.group_server import GroupCheck, GroupServer, check_group

log = logging.getLogger(__name__)

LOG_LINES = 500  # the group's output kept for a dialog


class GroupBridge(QObject):
    checked = Signal(object)  # a GroupCheck, for the hostfile and model last asked about
    started = Signal(str)  # "$ " and the command that runs (for the log)
    line = Signal(str)  # a line of the group's output
    serving = Signal(str)  # the API's address
    fault = Signal(str)  # a rank died or failed: the message names it and its host
    ended = Signal(str)  # the group is gone: "" after a clean stop, else why (one line)

    _relay = Signal(str, object)  # (signal name, args): any thread -> the GUI thread

    def __init__(
        self,
        data_dir: str,
        parent: QObject | None = None,
        server_factory: Callable[..., GroupServer] = GroupServer,
    ):
        """``server_factory``: how a group is started (a test passes one that adds arguments)."""
        super().__init__(parent)
        self.data_dir = data_dir
        self._server_factory = server_factory
        self._server: GroupServer | None = None
        self._check_asked: tuple[str, str] | None = None
        # what a dialog opened later shows: the running group's address, fault and output
        self.address = ""
        self.last_fault = ""
        self.lines: deque[str] = deque(maxlen=LOG_LINES)
        self._relay.connect(self._emit, Qt.ConnectionType.QueuedConnection)

    @property
    def running(self) -> bool:
        """A group was started and has not ended yet."""
        return self._server is not None

    def check(self, hostfile: str, model_path: str) -> None:
        """Read the hostfile and the model's config off the GUI thread; ``checked`` follows
        (a later call wins: an older answer is dropped)."""
        self._check_asked = (hostfile, model_path)
        threading.Thread(
            target=self._check,
            args=(hostfile, model_path),
            daemon=True,
            name="radixchat-group-check",
        ).start()

    def start(self, hostfile: str, model_path: str, port: int) -> None:
        """Start the group (returns at once); ``serving`` or ``fault``, then ``ended``, follow."""
        if self._server is not None:
            raise RuntimeError("a group is already running")
        self._server = self._server_factory(
            hostfile, model_path, port, self.data_dir, self._on_event
        )
        self.address, self.last_fault = "", ""
        self.lines.clear()
        self._server.start()
        command = "$ " + " ".join(self._server.command)
        self.lines.append(command)
        self.started.emit(command)

    def stop(self) -> None:
        """Stop the group as Ctrl-C would (returns at once; ``ended`` follows)."""
        if self._server is not None:
            self._server.stop()

    def shutdown(self, timeout: float = 60.0) -> None:
        """The app is closing: stop the group and wait for it (every rank flushes its cache)."""
        server = self._server
        if server is not None:
            server.stop()
            if not server.wait(timeout):
                log.warning("the group did not stop within %.0f s", timeout)

    # -- any thread --

    def _check(self, hostfile: str, model_path: str) -> None:
        try:
            result = check_group(hostfile, model_path)
        except Exception as exc:  # a bug: shown, and logged with its traceback
            log.exception("checking the hostfile failed")
            result = GroupCheck((), False, f"internal error: {exc}")
        self._relay.emit("checked", ((hostfile, model_path), result))

    def _on_event(self, kind: str, text: str) -> None:  # the group's watching thread
        self._relay.emit(kind, text)

    # -- GUI thread --

    def _emit(self, name: str, payload: object) -> None:
        if name == "checked":
            asked, result = payload
            if asked == self._check_asked:
                self.checked.emit(result)
            return
        if name == "ended":
            self._server = None
            self.address = ""
        elif name == "serving":
            self.address = payload
        elif name == "fault":
            self.last_fault = payload
        elif name == "line":
            self.lines.append(payload)
        getattr(self, name).emit(payload)
