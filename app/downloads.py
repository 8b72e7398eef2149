"""Downloads from the Hugging Face hub that run in the background while the user chats.

``DownloadManager`` (one per window) runs each download (``core.models.hub.download.pull``) on a
thread of its own and reports on the GUI thread: progress, done (with the spec the loader
takes), stopped or failed. Closing the model picker does not stop a download; cancelling one
keeps its bytes, and "Resume" continues it (so does the next start, even after a restart).
``DownloadsStatus`` shows the running downloads in the status bar; ``DownloadsDialog`` lists
them all with Cancel, Resume and Load.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QToolButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.format import FILE_UNITS_NOTE, file_bytes
from app.workers import Relay, run_in_thread
from core.models.hub import download, installed

RUNNING, DONE, STOPPED, FAILED = "running", "done", "stopped", "failed"
TARGET_ROLE = Qt.ItemDataRole.UserRole


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


def progress_text(p: download.DownloadProgress) -> str:
    return (
        f"{file_bytes(p.done_bytes)} of {file_bytes(p.total_bytes)} · {file_bytes(p.rate)}/s · "
        f"{duration_text(p.eta_seconds)} left"
    )


@dataclass(frozen=True)
class Download:
    """One download as the window knows it. ``target``: ``REPO[:FILE]``; ``spec``: what the
    loader takes once it is done; ``message``: its last line (an error, "cancelled…")."""

    target: str
    state: str = RUNNING
    progress: download.DownloadProgress | None = None
    spec: str | None = None
    message: str = ""

    def status(self) -> str:
        """Its state in a few words, for a list or the status bar."""
        if self.state == RUNNING:
            p = self.progress
            return f"{p.fraction:.0%} · {progress_text(p)}" if p else "starting…"
        if self.state == DONE:
            return "downloaded"
        return self.message or self.state


class DownloadManager(QObject):
    """Every download of the window, by target; its signals arrive on the GUI thread."""

    changed = Signal(str)  # target: its state or its progress moved
    progressed = Signal(str, object)  # target, DownloadProgress
    finished = Signal(str, str)  # target, the spec the loader takes
    failed = Signal(str, str)  # target, one line (a cancel included: the bytes are kept)

    def __init__(self, data_root: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.data_root = Path(data_root)
        self._downloads: dict[str, Download] = {}
        self._cancels: dict[str, threading.Event] = {}
        self._relays: dict[str, Relay] = {}

    def downloads(self) -> list[Download]:
        """This session's downloads, in the order they started, then unfinished ones left on
        disk by an earlier session (stopped: "Resume" continues them)."""
        known = list(self._downloads.values())
        repos = {download.parse_target(d.target)[0] for d in known}
        left = [
            Download(p.repo_id, STOPPED, message=f"{file_bytes(p.bytes)} kept: resume it")
            for p in installed.partial_downloads()
            if p.repo_id not in repos
        ]
        return known + left

    def get(self, target: str) -> Download | None:
        return self._downloads.get(target)

    def running(self) -> list[Download]:
        return [d for d in self._downloads.values() if d.state == RUNNING]

    def start(self, target: str) -> bool:
        """Start (or resume) downloading ``target``; False when it runs already."""
        current = self._downloads.get(target)
        if current is not None and current.state == RUNNING:
            return False
        cancel, root = threading.Event(), self.data_root
        relay = Relay()  # made here, on the GUI thread: the worker emits its progress

        def work() -> download.PullResult:
            return download.pull(
                target, data_root=root, cancel=cancel, progress=relay.progress.emit
            )

        self._downloads[target] = Download(target)
        self._cancels[target] = cancel
        self._relays[target] = relay
        run_in_thread(
            work,
            lambda result: self._on_done(target, result),
            lambda message: self._on_failed(target, message),
            lambda p: self._on_progress(target, p),
            relay=relay,
        )
        self.changed.emit(target)
        return True

    def cancel(self, target: str) -> None:
        """Stop ``target``: what came so far is kept; failed follows with "cancelled…"."""
        cancel = self._cancels.get(target)
        if cancel is not None:
            cancel.set()

    def cancel_all(self) -> None:
        for target in list(self._cancels):
            self.cancel(target)

    def forget(self, target: str) -> None:
        """Take a finished or stopped download off the list (its files stay)."""
        if target in self._downloads and self._downloads[target].state != RUNNING:
            del self._downloads[target]
            self.changed.emit(target)

    # -- worker results, on the GUI thread --

    def _on_progress(self, target: str, p: download.DownloadProgress) -> None:
        current = self._downloads.get(target)
        if current is None or current.state != RUNNING:
            return
        self._downloads[target] = replace(current, progress=p)
        self.progressed.emit(target, p)
        self.changed.emit(target)

    def _on_done(self, target: str, result: download.PullResult) -> None:
        self._end(target, Download(target, DONE, spec=result.spec))
        self.finished.emit(target, result.spec)

    def _on_failed(self, target: str, message: str) -> None:
        state = STOPPED if "cancelled" in message else FAILED
        self._end(target, Download(target, state, message=message))
        self.failed.emit(target, message)

    def _end(self, target: str, ended: Download) -> None:
        previous = self._downloads.get(target)
        self._downloads[target] = replace(ended, progress=previous.progress if previous else None)
        self._cancels.pop(target, None)
        self._relays.pop(target, None)
        self.changed.emit(target)


class DownloadsStatus(QWidget):
    """The status bar's view of the running downloads: a button (opens the list) and a bar."""

    def __init__(self, manager: DownloadManager, parent: QWidget | None = None):
        super().__init__(parent)
        self.manager = manager
        self.button = QToolButton()
        self.button.setAutoRaise(True)
        self.button.setToolTip("Downloads: cancel, resume, load")
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setFixedWidth(90)
        self.bar.setFixedHeight(10)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.button)
        row.addWidget(self.bar)
        manager.changed.connect(self.refresh)
        self.refresh()

    def refresh(self, _target: str = "") -> None:
        running = self.manager.running()
        self.setVisible(bool(running))
        if not running:
            return
        first = running[0]
        name = download.parse_target(first.target)[0].split("/")[-1]
        more = f" (+{len(running) - 1})" if len(running) > 1 else ""
        fraction = first.progress.fraction if first.progress else 0.0
        self.button.setText(f"Downloading {name}{more}: {fraction:.0%}")
        self.bar.setValue(int(fraction * 1000))


class DownloadsDialog(QDialog):
    """Every download, with Cancel, Resume and Load (``loadRequested(spec)``)."""

    loadRequested = Signal(str)

    def __init__(self, manager: DownloadManager, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Downloads")
        self.manager = manager
        self.tree = QTreeWidget()
        self.tree.setColumnCount(2)
        self.tree.setHeaderLabels(("Model", "Status"))
        self.tree.headerItem().setToolTip(1, FILE_UNITS_NOTE.capitalize())
        self.tree.setRootIsDecorated(False)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        header = self.tree.header()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.tree.currentItemChanged.connect(self._update_buttons)
        self.tree.itemDoubleClicked.connect(self._on_load)
        self.empty = QLabel("No download yet: search the hub under Model… › Download.")
        self.cancel_button = QPushButton("Cancel Download")
        self.cancel_button.setToolTip("Stop it; what came so far is kept, to resume later")
        self.cancel_button.clicked.connect(self._on_cancel)
        self.resume_button = QPushButton("Resume")
        self.resume_button.clicked.connect(self._on_resume)
        self.load_button = QPushButton("Load")
        self.load_button.setToolTip("Load the downloaded model in place of the current one")
        self.load_button.clicked.connect(self._on_load)
        buttons = QHBoxLayout()
        buttons.addStretch()
        for button in (self.cancel_button, self.resume_button, self.load_button):
            buttons.addWidget(button)
        column = QVBoxLayout(self)
        column.addWidget(self.empty)
        column.addWidget(self.tree, 1)
        column.addLayout(buttons)
        manager.changed.connect(self.refresh)
        self.refresh()
        self.resize(640, 300)

    def refresh(self, target: str = "") -> None:
        """The list again; a running download's progress only moves its own row (the disk
        is read for unfinished downloads of earlier sessions on other changes only)."""
        current = self.manager.get(target) if target else None
        row = self._row(target) if current is not None and current.state == RUNNING else None
        if row is not None:
            row.setText(1, current.status())
            return
        selected = self.selected()
        self.tree.clear()
        downloads = self.manager.downloads()
        self.empty.setVisible(not downloads)
        for item in downloads:
            row = QTreeWidgetItem([item.target, item.status()])
            row.setData(0, TARGET_ROLE, item.target)
            row.setToolTip(1, item.status())
            self.tree.addTopLevelItem(row)
            if item.target == selected:
                self.tree.setCurrentItem(row)
        if self.tree.currentItem() is None and downloads:
            self.tree.setCurrentItem(self.tree.topLevelItem(0))
        self._update_buttons()

    def _row(self, target: str) -> QTreeWidgetItem | None:
        for r in range(self.tree.topLevelItemCount()):
            if self.tree.topLevelItem(r).data(0, TARGET_ROLE) == target:
                return self.tree.topLevelItem(r)
        return None

    def selected(self) -> str | None:
        item = self.tree.currentItem()
        return item.data(0, TARGET_ROLE) if item is not None else None

    def row_texts(self) -> list[tuple[str, str]]:
        return [
            (self.tree.topLevelItem(r).text(0), self.tree.topLevelItem(r).text(1))
            for r in range(self.tree.topLevelItemCount())
        ]

    def _current(self) -> Download | None:
        target = self.selected()
        return next((d for d in self.manager.downloads() if d.target == target), None)

    def _update_buttons(self, *_args) -> None:
        current = self._current()
        state = current.state if current is not None else None
        self.cancel_button.setEnabled(state == RUNNING)
        self.resume_button.setEnabled(state in (STOPPED, FAILED))
        self.load_button.setEnabled(state == DONE)

    def _on_cancel(self) -> None:
        target = self.selected()
        if target:
            self.manager.cancel(target)

    def _on_resume(self) -> None:
        target = self.selected()
        if target:
            self.manager.start(target)

    def _on_load(self, *_args) -> None:
        current = self._current()
        if current is not None and current.state == DONE and current.spec:
            self.loadRequested.emit(current.spec)
