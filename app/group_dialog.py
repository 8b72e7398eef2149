"""Serve settings for a group of Macs: pick a hostfile, see its hosts and whether the model
splits over them, start and stop the API served by the group, and see its state and any
fault plainly.

The dialog only talks to a :class:`~app.group_bridge.GroupBridge`; every answer (the
check, the group's state) comes back as a signal, so the window never waits. Closing the
dialog leaves the group running; the Server menu opens it again.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.group_bridge import LOG_LINES, GroupBridge
from core.distributed.group_server import GroupCheck

OK_STYLE = "color: #1a7f37;"
FAULT_STYLE = "color: #cf222e; font-weight: 600;"


class GroupServeDialog(QDialog):
    """``model_name`` and ``model_path``: the model the group serves (the app's current one)."""

    def __init__(
        self,
        bridge: GroupBridge,
        model_name: str,
        model_path: str,
        hostfile: str = "",
        port: int = 8000,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Serve over several Macs")
        self.bridge = bridge
        self.model_path = model_path
        self.check_result: GroupCheck | None = None
        self.state = "stopped"  # stopped, starting, serving, stopping
        self.serving_address = ""
        self._checked_path: str | None = None  # the hostfile last checked

        self.hostfile = QLineEdit(hostfile)
        self.hostfile.setPlaceholderText("hosts.json: mlx.launch's hostfile, this Mac first")
        self.hostfile.editingFinished.connect(self._on_hostfile_edited)
        self.browse_button = QPushButton("Choose…")
        self.browse_button.clicked.connect(self._on_browse)
        row = QHBoxLayout()
        row.addWidget(self.hostfile, 1)
        row.addWidget(self.browse_button)
        self.hosts = QListWidget()
        self.hosts.setMaximumHeight(self.fontMetrics().lineSpacing() * 5 + 8)
        self.hosts.setToolTip(
            "Rank 0, the first host, serves the API; every host runs its part of the model"
        )
        self.model_label = QLabel(model_name)
        self.model_label.setToolTip(model_path)
        self.split_label = QLabel("Choose a hostfile")
        self.split_label.setWordWrap(True)
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(port)
        self.port.setToolTip("Rank 0 serves the API on 127.0.0.1 at this port")
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.fault_label = QLabel()
        self.fault_label.setWordWrap(True)
        self.fault_label.setStyleSheet(FAULT_STYLE)
        self.fault_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.fault_label.hide()
        self.start_button = QPushButton("Start Group")
        self.start_button.clicked.connect(self.start)
        self.stop_button = QPushButton("Stop Group")
        self.stop_button.clicked.connect(self.stop)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(LOG_LINES)
        self.log.setFont(QFont("Menlo, Monaco, monospace", self.font().pointSize() - 1))
        self.log.setPlaceholderText("The group's output appears here")

        form = QFormLayout()
        form.addRow("Hostfile:", row)
        form.addRow("Hosts:", self.hosts)
        form.addRow("Model:", self.model_label)
        form.addRow("Split:", self.split_label)
        form.addRow("Port:", self.port)
        buttons = QHBoxLayout()
        buttons.addWidget(self.status_label, 1)
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.stop_button)
        column = QVBoxLayout(self)
        column.addLayout(form)
        column.addWidget(self.fault_label)
        column.addLayout(buttons)
        column.addWidget(self.log, 1)
        self.resize(640, 520)

        bridge.checked.connect(self._on_checked)
        bridge.started.connect(self._append)
        bridge.line.connect(self._append)
        bridge.serving.connect(self._on_serving)
        bridge.fault.connect(self._on_fault)
        bridge.ended.connect(self._on_ended)
        if bridge.running:  # reopened while a group runs: where it stands
            self.state = "serving" if bridge.address else "starting"
            self.serving_address = bridge.address
            self.log.setPlainText("\n".join(bridge.lines))
            if bridge.last_fault:
                self._on_fault(bridge.last_fault)
        self._update()
        if hostfile:
            self.check()

    # ------------------------------------------------------------------ actions
    def check(self) -> None:
        """Read the hostfile and whether the model splits over it (the answer comes back)."""
        path = self.hostfile.text().strip()
        self._checked_path = path
        self.check_result = None
        self.hosts.clear()
        if not path:
            self.split_label.setText("Choose a hostfile")
            self.split_label.setStyleSheet("")
        else:
            self.split_label.setText("Checking…")
            self.split_label.setStyleSheet("")
            self.bridge.check(path, self.model_path)
        self._update()

    def start(self) -> None:
        if self.check_result is None or not self.check_result.splits or self.bridge.running:
            return
        self.fault_label.hide()
        self.log.clear()
        self.state = "starting"
        self.bridge.start(self.hostfile.text().strip(), self.model_path, self.port.value())
        self._update()

    def stop(self) -> None:
        if not self.bridge.running:
            return
        self.state = "stopping"
        self.bridge.stop()
        self._update()

    # ------------------------------------------------------------------ answers
    def _on_checked(self, result: GroupCheck) -> None:
        self.check_result = result
        self.hosts.clear()
        for rank, host in enumerate(result.hosts):
            self.hosts.addItem(f"rank {rank}: {host}" + ("  — serves the API" if rank == 0 else ""))
        self.split_label.setText(("✓ " if result.splits else "✗ ") + result.summary)
        self.split_label.setStyleSheet(OK_STYLE if result.splits else FAULT_STYLE)
        self._update()

    def _on_serving(self, address: str) -> None:
        self.state = "serving"
        self.serving_address = address
        self._update()

    def _on_fault(self, message: str) -> None:
        self.fault_label.setText(f"The group broke: {message}")
        self.fault_label.show()
        self.state = "stopping"
        self._update()

    def _on_ended(self, reason: str) -> None:
        if reason and self.fault_label.isHidden():
            self.fault_label.setText(f"The group could not run: {reason}")
            self.fault_label.show()
        self.state = "stopped"
        self._update()

    def _on_hostfile_edited(self) -> None:  # also when the field loses focus: check a change only
        if self.hostfile.text().strip() != self._checked_path:
            self.check()

    def _append(self, line: str) -> None:
        self.log.appendPlainText(line)

    # ------------------------------------------------------------------ state
    def _update(self) -> None:
        hosts = self.check_result.hosts if self.check_result else ()
        texts = {
            "stopped": "Not running",
            "starting": f"Starting on {len(hosts)} hosts…" if hosts else "Starting…",
            "serving": f"Serving at {self.serving_address}"
            + (f" over {len(hosts)} hosts" if hosts else ""),
            "stopping": "Stopping the group…",
        }
        self.status_label.setText(texts[self.state])
        running = self.bridge.running
        ready = self.check_result is not None and self.check_result.splits
        self.start_button.setEnabled(ready and not running)
        self.stop_button.setEnabled(running and self.state != "stopping")
        for widget in (self.hostfile, self.browse_button, self.port):
            widget.setEnabled(not running)

    def _on_browse(self) -> None:
        path = self._ask_file(self.hostfile.text())
        if path:
            self.hostfile.setText(path)
            self.check()

    def _ask_file(self, start: str) -> str:
        """The hostfile the user picks ("" if cancelled); a test replaces it."""
        path, _ = QFileDialog.getOpenFileName(
            self, "Choose a hostfile", start, "Hostfiles (*.json);;All files (*)"
        )
        return path
