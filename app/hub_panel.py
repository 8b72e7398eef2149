"""The picker's "Download" tab: search the Hugging Face hub, see whether each model fits,
download one with a progress bar (bytes, rate, time left), cancel, resume.

Every hub call runs on a plain Python thread (core.models.hub / download do the work);
results come back to the GUI thread through :class:`_Relay`'s signals, so the window
stays responsive. A cancelled download keeps its bytes: "Resume" continues it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.format import human_bytes
from core.errors import UserError
from core.models import download, hub

COLUMNS = ("Model", "Kind", "Parameters", "Quant", "Size", "Fits?", "Downloads")
FIT_COLUMN = 5
RESULT_ROLE = Qt.ItemDataRole.UserRole
FIT_COLORS = {hub.FITS: "#2e7d32", hub.TIGHT: "#b26a00", hub.WONT_FIT: "#c62828"}


class _Relay(QObject):
    """Carries a worker thread's results to the GUI thread (queued signals)."""

    done = Signal(object)
    failed = Signal(str)
    progress = Signal(object)


def run_in_thread(work: Callable[[], object], on_done, on_failed, on_progress=None) -> _Relay:
    """Run ``work`` on a daemon thread; its result (or a UserError's line) arrives in the
    GUI thread. Keep the returned relay alive until then."""
    relay = _Relay()
    relay.done.connect(on_done)
    relay.failed.connect(on_failed)
    if on_progress is not None:
        relay.progress.connect(on_progress)

    def target() -> None:
        try:
            result = work()
        except UserError as exc:
            relay.failed.emit(str(exc))
        except Exception as exc:  # a bug: say so in one line, keep the window alive
            import logging

            logging.getLogger(__name__).exception("hub worker failed")
            relay.failed.emit(f"unexpected error: {type(exc).__name__}: {exc}")
        else:
            relay.done.emit(result)

    threading.Thread(target=target, name="hub-worker", daemon=True).start()
    return relay


def parameters_text(n: int | None) -> str:
    if not n:
        return ""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


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
        f"{human_bytes(p.done_bytes)} of {human_bytes(p.total_bytes)} · {human_bytes(p.rate)}/s · "
        f"{duration_text(p.eta_seconds)} left"
    )


class HubPanel(QWidget):
    """Search, fits badge, download with progress, cancel, resume. ``downloaded(spec)``
    fires when a model is complete and loadable; ``progressed`` with each update shown."""

    downloaded = Signal(str)
    progressed = Signal(object)  # DownloadProgress, after the bar shows it

    def __init__(self, data_root, on_cpu: bool, parent: QWidget | None = None):
        super().__init__(parent)
        self.data_root, self.on_cpu = data_root, on_cpu
        self._relays: list[_Relay] = []
        self._cancel: threading.Event | None = None
        self._downloading: str | None = None

        self.query = QLineEdit()
        self.query.setPlaceholderText("Search the Hugging Face hub: qwen3, llama-3.2, gemma-3…")
        self.query.returnPressed.connect(self.search)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        self.results = QTreeWidget()
        self.results.setColumnCount(len(COLUMNS))
        self.results.setHeaderLabels(COLUMNS)
        self.results.setRootIsDecorated(False)
        self.results.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.results.headerItem().setToolTip(
            FIT_COLUMN,
            "The weights as this machine will hold them plus the KV "
            "pool, against its memory: fits (up to 70 %), tight, "
            "won't fit",
        )
        header = self.results.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in range(1, len(COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.results.currentItemChanged.connect(self._on_result_changed)
        self.file_box = QComboBox()  # a GGUF repo's files (quantizations)
        self.file_box.hide()
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(True)
        self.progress.hide()
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self.start_download)
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.clicked.connect(self.cancel_download)
        self.cancel_button.hide()

        row = QHBoxLayout()
        row.addWidget(self.query, 1)
        row.addWidget(self.search_button)
        actions = QHBoxLayout()
        actions.addWidget(self.file_box, 1)
        actions.addWidget(self.progress, 2)
        actions.addWidget(self.cancel_button)
        actions.addWidget(self.download_button)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.addLayout(row)
        column.addWidget(self.results, 1)
        column.addWidget(self.status)
        column.addLayout(actions)
        self._update_buttons()

    # -- search --

    def search(self) -> None:
        text = self.query.text().strip()
        if not text:
            return
        self.search_button.setEnabled(False)
        self._say(f"Searching for “{text}”…")
        self._keep(
            run_in_thread(
                lambda: hub.search(text, on_cpu=self.on_cpu),
                self._on_results,
                self._on_search_failed,
            )
        )

    def _on_results(self, results: list[hub.SearchResult]) -> None:
        self.search_button.setEnabled(True)
        self.results.clear()
        for result in results:
            self._add_result(result)
        self._say(f"{len(results)} models" if results else "No MLX or GGUF model matches.")
        self._update_buttons()

    def _on_search_failed(self, message: str) -> None:
        self.search_button.setEnabled(True)
        self._say(message, error=True)

    def _add_result(self, r: hub.SearchResult) -> None:
        fit = r.fit.label if r.fit and not r.problem else ("can't load" if r.problem else "?")
        name = r.repo_id + ("  🔒" if r.gated else "")
        item = QTreeWidgetItem(
            [
                name,
                "MLX" if r.kind == "mlx" else "GGUF",
                parameters_text(r.parameters),
                r.quantization or "",
                human_bytes(r.size_bytes) if r.size_bytes else "",
                fit,
                f"{r.downloads:,}",
            ]
        )
        item.setData(0, RESULT_ROLE, r)
        color = FIT_COLORS.get(fit, "#777777")
        item.setForeground(FIT_COLUMN, QBrush(QColor("white")))
        item.setBackground(FIT_COLUMN, QBrush(QColor(color)))
        item.setTextAlignment(FIT_COLUMN, Qt.AlignmentFlag.AlignCenter)
        tips = [r.problem] if r.problem else []
        if r.fit:
            tips.append(
                f"about {human_bytes(r.fit.weights_bytes)} of weights + "
                f"{human_bytes(r.fit.kv_pool_bytes)} of KV pool, of "
                f"{human_bytes(r.fit.machine_bytes)}"
            )
        if r.gated:
            tips.append(
                "gated: needs your Hugging Face token (HF_TOKEN or `hf auth login`) and its "
                "licence accepted"
            )
        item.setToolTip(0, "\n".join(tips))
        item.setToolTip(FIT_COLUMN, "\n".join(tips))
        if r.problem:
            for c in range(len(COLUMNS)):
                if c != FIT_COLUMN:
                    item.setForeground(c, QBrush(QColor("#999999")))
        self.results.addTopLevelItem(item)

    def _on_result_changed(self, item: QTreeWidgetItem | None) -> None:
        self.file_box.clear()
        self.file_box.hide()
        result = self.selected_result()
        if result is not None and result.kind == "gguf" and not result.problem:
            repo = result.repo_id
            self._say(f"Listing the GGUF files of {repo}…")
            self._keep(
                run_in_thread(
                    lambda: hub.gguf_files(repo),
                    lambda files: self._on_files(repo, files),
                    lambda m: self._say(m, error=True),
                )
            )
        self._update_buttons()

    def _on_files(self, repo_id: str, files: tuple[hub.RepoFile, ...]) -> None:
        result = self.selected_result()
        if result is None or result.repo_id != repo_id:
            return
        for f in files:
            fit = hub.estimate_fit("gguf", f.size, None, self.on_cpu)
            self.file_box.addItem(f"{f.path} · {human_bytes(f.size)} · {fit.label}", f.path)
        self.file_box.setVisible(bool(files))
        self._say(
            f"{len(files)} GGUF files: choose one" if files else f"{repo_id} has no GGUF file"
        )
        self._update_buttons()

    def selected_result(self) -> hub.SearchResult | None:
        item = self.results.currentItem()
        return item.data(0, RESULT_ROLE) if item is not None else None

    # -- download --

    def target(self) -> str | None:
        result = self.selected_result()
        if result is None or result.problem:
            return None
        if result.kind == "gguf":
            path = self.file_box.currentData()
            return f"{result.repo_id}:{path}" if path else None
        return result.repo_id

    def start_download(self) -> None:
        target = self.target()
        if target is None or self._downloading:
            return
        self._downloading, self._cancel = target, threading.Event()
        cancel, root = self._cancel, self.data_root
        self.progress.setValue(0)
        self.progress.setFormat("starting…")
        self.progress.show()
        self._say(f"Downloading {target}…")
        relay = _Relay()  # created here so the progress callback can emit from the worker

        def work():
            return download.pull(
                target, data_root=root, cancel=cancel, progress=relay.progress.emit
            )

        self._keep(run_in_thread(work, self._on_downloaded, self._on_download_failed))
        self._keep(relay)
        relay.progress.connect(self._on_progress)
        self._update_buttons()

    def cancel_download(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
            self.cancel_button.setEnabled(False)
            self._say("Cancelling…")

    def is_downloading(self) -> bool:
        return self._downloading is not None

    def _on_progress(self, p: download.DownloadProgress) -> None:
        if self._downloading is None:
            return
        self.progress.setValue(int(p.fraction * 1000))
        self.progress.setFormat(f"{p.fraction * 100:.0f}% · {progress_text(p)}")
        self.progressed.emit(p)

    def _on_downloaded(self, result: download.PullResult) -> None:
        self._downloading = self._cancel = None
        self.progress.setValue(1000)
        self.progress.setFormat(f"done · {human_bytes(result.total_bytes)}")
        self._say(f"{result.spec} is downloaded: it is selected under “On this machine”.")
        self._update_buttons()
        self.downloaded.emit(result.spec)

    def _on_download_failed(self, message: str) -> None:
        self._downloading = self._cancel = None
        self.progress.setFormat("stopped")
        self._say(message, error=True)
        self._update_buttons()

    # -- helpers --

    def _update_buttons(self) -> None:
        busy = self._downloading is not None
        self.cancel_button.setVisible(busy)
        self.cancel_button.setEnabled(busy)
        target = self.target()
        self.download_button.setEnabled(not busy and target is not None)
        self.download_button.setText(
            "Resume" if target and not busy and self._has_partial(target) else "Download"
        )

    def _has_partial(self, target: str) -> bool:
        from core.models import installed

        repo_id = download.parse_target(target)[0]
        return any(p.repo_id == repo_id for p in installed.partial_downloads())

    def _say(self, message: str, error: bool = False) -> None:
        self.status.setStyleSheet("color: #c0392b;" if error else "")
        self.status.setText(message)

    def _keep(self, relay: _Relay) -> None:
        self._relays = [r for r in self._relays[-8:]] + [relay]
