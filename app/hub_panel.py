"""The picker's "Download" tab: a short curated list of good chat models before any search
(``resources/curated_models.json``, each with its fits badge for this machine), search the
Hugging Face hub, see whether each model fits, download one with a progress bar (bytes, rate,
time left), cancel, resume.

Every hub call runs on a plain Python thread (core.models.hub.client / download do the work);
results come back to the GUI thread through :mod:`app.workers`' relays, so the window stays
responsive. Downloads belong to the window's :class:`~app.downloads.DownloadManager`: they go
on after the picker closes. A cancelled download keeps its bytes: "Resume" continues it.
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QIcon, QPainter, QPainterPath, QPen, QPixmap
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

from app.curated import CuratedModel, curated_models
from app.downloads import DONE, RUNNING, DownloadManager, progress_text
from app.format import FILE_UNITS_NOTE, file_bytes, human_bytes
from app.workers import Relay, run_in_thread
from core.models.hub import client, download, installed
from core.models.hub.fit import FITS, TIGHT, WONT_FIT, estimate_fit
from core.models.hub.search import SearchResult, search

COLUMNS = ("Model", "Kind", "Parameters", "Quant", "Size", "Fits?", "Downloads")
FIT_COLUMN = 5
RESULT_ROLE = Qt.ItemDataRole.UserRole
CURATED_ROLE = Qt.ItemDataRole.UserRole + 1  # a curated row's CuratedModel
FIT_COLORS = {FITS: "#2e7d32", TIGHT: "#b26a00", WONT_FIT: "#c62828"}


def parameters_text(n: int | None) -> str:
    if not n:
        return ""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def lock_icon(size: int = 16, colour: str = "#8a6d3b") -> QIcon:
    """A padlock drawn with QPainter: the 🔒 emoji is an empty box where no emoji font is
    installed (most Linux desktops)."""
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    pen = QPen(QColor(colour), size / 8)
    painter.setPen(pen)
    shackle = QPainterPath()
    shackle.moveTo(QPointF(size * 0.3, size * 0.5))
    shackle.lineTo(QPointF(size * 0.3, size * 0.32))
    shackle.arcTo(QRectF(size * 0.3, size * 0.1, size * 0.4, size * 0.4), 180, -180)
    shackle.lineTo(QPointF(size * 0.7, size * 0.5))
    painter.drawPath(shackle)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(colour))
    painter.drawRoundedRect(QRectF(size * 0.18, size * 0.45, size * 0.64, size * 0.47), 2, 2)
    painter.end()
    return QIcon(pixmap)


class HubPanel(QWidget):
    """Curated models, search, fits badge, download with progress, cancel, resume.
    ``downloaded(spec)`` fires when a model started here is complete and loadable;
    ``progressed`` with each update shown. The downloads belong to ``downloads`` (the
    window's manager; a panel of its own without one)."""

    downloaded = Signal(str)
    progressed = Signal(object)  # DownloadProgress, after the bar shows it

    def __init__(
        self,
        data_root,
        on_cpu: bool,
        parent: QWidget | None = None,
        downloads: DownloadManager | None = None,
    ):
        super().__init__(parent)
        self.data_root, self.on_cpu = data_root, on_cpu
        self.downloads = downloads if downloads is not None else DownloadManager(data_root, self)
        self._relays: list[Relay] = []
        self._downloading: str | None = None  # the download this panel shows

        self.query = QLineEdit()
        self.query.setPlaceholderText("Search the Hugging Face hub: qwen3, llama-3.2, gemma-3…")
        self.query.returnPressed.connect(self.search)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        self.heading = QLabel()
        self.heading.setWordWrap(True)
        self.results = QTreeWidget()
        self.results.setColumnCount(len(COLUMNS))
        self.results.setHeaderLabels(COLUMNS)
        self.results.headerItem().setToolTip(COLUMNS.index("Size"), FILE_UNITS_NOTE.capitalize())
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
        self.file_box.currentIndexChanged.connect(lambda _i: self._update_buttons())
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
        column.addWidget(self.heading)
        column.addWidget(self.results, 1)
        column.addWidget(self.status)
        column.addLayout(actions)
        self.downloads.progressed.connect(self._on_progress)
        self.downloads.finished.connect(self._on_downloaded)
        self.downloads.failed.connect(self._on_download_failed)
        self.show_curated()
        running = self.downloads.running()
        if running:  # a download started earlier goes on: show it
            self._show_download(running[0].target)
        self._update_buttons()

    # -- the curated list and search --

    def show_curated(self) -> None:
        """The curated chat models, each with its fits badge (before any search)."""
        self.results.clear()
        models = curated_models(self.on_cpu)
        for model in models:
            self._add_result(model.result, model)
        machine = models[0].result.fit.machine_bytes if models else 0
        self.heading.setText(
            f"Good chat models to start with (this machine: {human_bytes(machine)}); "
            "search the hub for others."
        )

    def search(self) -> None:
        text = self.query.text().strip()
        if not text:
            return
        self.search_button.setEnabled(False)
        self.say(f"Searching for “{text}”…")
        self._keep(
            run_in_thread(
                lambda: search(text, on_cpu=self.on_cpu),
                self._on_results,
                self._on_search_failed,
            )
        )

    def _on_results(self, results: list[SearchResult]) -> None:
        self.search_button.setEnabled(True)
        self.results.clear()
        self.heading.setText(f"Search results for “{self.query.text().strip()}”")
        for result in results:
            self._add_result(result)
        self.say(f"{len(results)} models" if results else "No MLX or GGUF model matches.")
        self._update_buttons()

    def _on_search_failed(self, message: str) -> None:
        self.search_button.setEnabled(True)
        self.say(message, error=True)

    def _add_result(self, r: SearchResult, curated: CuratedModel | None = None) -> None:
        fit = r.fit.label if r.fit and not r.problem else ("can't load" if r.problem else "?")
        item = QTreeWidgetItem(
            [
                r.repo_id,
                "MLX" if r.kind == "mlx" else "GGUF",
                parameters_text(r.parameters),
                r.quantization or "",
                file_bytes(r.size_bytes) if r.size_bytes else "",
                fit,
                f"{r.downloads:,}" if curated is None else "",
            ]
        )
        item.setData(0, RESULT_ROLE, r)
        item.setData(0, CURATED_ROLE, curated)
        color = FIT_COLORS.get(fit, "#777777")
        item.setForeground(FIT_COLUMN, QBrush(QColor("white")))
        item.setBackground(FIT_COLUMN, QBrush(QColor(color)))
        item.setTextAlignment(FIT_COLUMN, Qt.AlignmentFlag.AlignCenter)
        tips = [r.problem] if r.problem else []
        if curated is not None:
            tips.append(f"{curated.note}; a good start with {curated.memory_gb} GB of memory")
        if r.fit:
            tips.append(
                f"about {human_bytes(r.fit.weights_bytes)} of weights + "
                f"{human_bytes(r.fit.kv_pool_bytes)} of KV pool, of "
                f"{human_bytes(r.fit.machine_bytes)}"
            )
        if r.gated:
            item.setIcon(0, lock_icon())
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
        curated = item.data(0, CURATED_ROLE) if item is not None else None
        if curated is not None and curated.file:  # its file is known: no call to the hub
            self.file_box.addItem(
                f"{curated.file} · {file_bytes(result.size_bytes)} · {result.fit.label}",
                curated.file,
            )
            self.file_box.show()
        elif result is not None and result.kind == "gguf" and not result.problem:
            repo = result.repo_id
            self.say(f"Listing the GGUF files of {repo}…")
            self._keep(
                run_in_thread(
                    lambda: client.gguf_files(repo),
                    lambda files: self._on_files(repo, files),
                    lambda m: self.say(m, error=True),
                )
            )
        target = self.target()
        if target is not None and self.downloads.get(target) is not None:
            self._show_download(target)
        self._update_buttons()

    def _on_files(self, repo_id: str, files: tuple[client.RepoFile, ...]) -> None:
        result = self.selected_result()
        if result is None or result.repo_id != repo_id:
            return
        for f in files:
            fit = estimate_fit("gguf", f.size, None, self.on_cpu)
            self.file_box.addItem(f"{f.path} · {file_bytes(f.size)} · {fit.label}", f.path)
        self.file_box.setVisible(bool(files))
        default = client.default_gguf(files, self.on_cpu)
        if default is not None:
            self.file_box.setCurrentIndex(self.file_box.findData(default[0].path))
        if default is not None and len(files) > 1:
            self.say(
                f"{len(files)} GGUF files: {default[0].path} ({default[1]}), or choose another"
            )
        else:
            self.say(
                f"{len(files)} GGUF files: choose one" if files else f"{repo_id} has no GGUF file"
            )
        self._update_buttons()

    def selected_result(self) -> SearchResult | None:
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
        """Download the selected model, in the background: it goes on after the picker
        closes (the status bar and Model › Downloads… show it)."""
        target = self.target()
        if target is None or self.is_downloading():
            return
        if self.downloads.start(target):
            self._show_download(target)
            self.say(f"Downloading {target}… (it goes on if you close this window)")
        self._update_buttons()

    def cancel_download(self) -> None:
        if self._downloading is not None:
            self.downloads.cancel(self._downloading)
            self.cancel_button.setEnabled(False)
            self.say("Cancelling…")

    def is_downloading(self) -> bool:
        current = self.downloads.get(self._downloading) if self._downloading else None
        return current is not None and current.state == RUNNING

    def _show_download(self, target: str) -> None:
        self._downloading = target
        current = self.downloads.get(target)
        self.progress.show()
        if current is not None and current.progress is not None:
            self._on_progress(target, current.progress)
        elif current is not None and current.state == DONE:
            self.progress.setValue(1000)
            self.progress.setFormat("done")
        else:
            self.progress.setValue(0)
            self.progress.setFormat("starting…")

    def _on_progress(self, target: str, p: download.DownloadProgress) -> None:
        if target != self._downloading:
            return
        self.progress.setValue(int(p.fraction * 1000))
        self.progress.setFormat(f"{p.fraction * 100:.0f}% · {progress_text(p)}")
        self.progressed.emit(p)

    def _on_downloaded(self, target: str, spec: str) -> None:
        if target != self._downloading:
            return
        self.progress.setValue(1000)
        self.progress.setFormat("done")
        self.say(f"{spec} is downloaded: it is selected under “On this machine”.")
        self._update_buttons()
        self.downloaded.emit(spec)

    def _on_download_failed(self, target: str, message: str) -> None:
        if target != self._downloading:
            return
        self.progress.setFormat("stopped")
        self.say(message, error=True)
        self._update_buttons()

    # -- helpers --

    def _update_buttons(self) -> None:
        busy = self.is_downloading()
        self.cancel_button.setVisible(busy)
        self.cancel_button.setEnabled(busy)
        target = self.target()
        self.download_button.setEnabled(not busy and target is not None)
        self.download_button.setText(
            "Resume" if target and not busy and self._has_partial(target) else "Download"
        )

    def _has_partial(self, target: str) -> bool:
        repo_id = download.parse_target(target)[0]
        return any(p.repo_id == repo_id for p in installed.partial_downloads())

    def say(self, message: str, error: bool = False) -> None:
        """A line under the results (an error in red)."""
        self.status.setStyleSheet("color: #c0392b;" if error else "")
        self.status.setText(message)

    def _keep(self, relay: Relay) -> None:
        self._relays = [r for r in self._relays[-8:]] + [relay]
