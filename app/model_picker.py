"""The model picker: known models, local GGUF files and MLX folders, models downloaded
from the Hugging Face hub (with their last use), with the memory each will take and base
models marked "base: completion only"; delete one (the data folder's or the hub's), and
its cached KV; any .gguf file or MLX folder on disk; and a "Download" tab that searches
the hub (app.hub_panel)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPushButton,
    QTabWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.downloads import DownloadManager
from app.format import FILE_UNITS_NOTE, file_bytes, human_bytes
from app.hub_panel import HubPanel
from core.errors import UserError
from core.models import derived, usage
from core.models.base_models import BASE_LABEL
from core.models.catalog import CatalogEntry, entry_for_path, model_catalog, runs_on_cpu
from core.models.delete import delete_from_data_folder
from core.models.hub import installed
from core.models.local import DATA_FOLDER_KINDS, LocalModel, list_local_models, model_file
from core.models.pypi.known import KNOWN_MODELS

COLUMNS = ("Name", "Kind", "Size", "Memory", "Last used")
KIND_LABELS = {
    "known-gguf": "GGUF",
    "gguf": "GGUF",
    "mlx-dir": "MLX folder",
    "hf-cache": "Hugging Face cache",
    "hf-gguf": "GGUF · Hugging Face cache",
}
SPEC_ROLE = Qt.ItemDataRole.UserRole
BASE_TIP = (
    "A base model: it continues text rather than chatting (its files carry no chat "
    "template, or its name says base). Chats still get replies, through a fallback template; "
    "pick an instruct model to chat."
)


class ModelPickerDialog(QDialog):
    """Pick the model to load. ``chosen_spec()`` is what the loader takes: a known
    model's name, a path, or a Hugging Face repo id.

    ``current_spec`` is preselected (added as a row when it is a file or folder the
    list does not show). ``on_cpu``: whether the memory column assumes MLX's CPU
    backend (float32 weights); by default, everywhere but macOS. ``downloads``: the
    window's downloads, which go on after the picker closes."""

    def __init__(
        self,
        data_root: Path,
        current_spec: str | None = None,
        parent: QWidget | None = None,
        on_cpu: bool | None = None,
        downloads: DownloadManager | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Choose a model")
        self.on_cpu = runs_on_cpu() if on_cpu is None else on_cpu
        self.data_root, self.current_spec = Path(data_root), current_spec
        self._hub_models: dict[str, installed.InstalledModel] = {}
        self._own_models: dict[str, LocalModel] = {}  # the data folder's, by spec

        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setRootIsDecorated(False)
        self.tree.setUniformRowHeights(True)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.tree.headerItem().setToolTip(2, f"On disk ({FILE_UNITS_NOTE})")
        self.tree.headerItem().setToolTip(3, self._memory_note())
        for column in (2, 3):
            self.tree.headerItem().setTextAlignment(
                column, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
            )
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in range(1, len(COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.itemDoubleClicked.connect(self.accept)
        self.tree.currentItemChanged.connect(self._on_current_changed)

        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #c0392b;")
        self.error_label.hide()
        note = QLabel(self._memory_note())
        note.setWordWrap(True)
        note.setEnabled(False)  # dim

        self.gguf_button = QPushButton("Open .gguf file…")
        self.gguf_button.clicked.connect(self._on_open_gguf)
        self.folder_button = QPushButton("Open MLX folder…")
        self.folder_button.clicked.connect(self._on_open_folder)
        self.delete_button = QPushButton("Delete…")
        self.delete_button.setToolTip(
            "Delete the model (from the data folder or the hub's cache), the files made from "
            "it and its cached KV"
        )
        self.delete_button.clicked.connect(self._on_delete)
        self.clean_button = QPushButton("Delete Derived Files…")
        self.clean_button.setToolTip(
            "Delete the files made from models at load (tokenizers, kept conversions); the "
            "next load makes what it needs again"
        )
        self.clean_button.clicked.connect(self._on_clean)
        self.disk_label = QLabel()
        self.disk_label.setEnabled(False)  # dim
        self._derived: dict[str, list[derived.DerivedFile]] = {}  # by spec
        self.hub_panel = HubPanel(self.data_root, self.on_cpu, downloads=downloads)
        self.hub_panel.downloaded.connect(self._on_downloaded)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        files = QHBoxLayout()
        files.addWidget(self.gguf_button)
        files.addWidget(self.folder_button)
        files.addWidget(self.delete_button)
        files.addWidget(self.clean_button)
        files.addStretch()
        files.addWidget(self.disk_label)
        local = QWidget()
        local_column = QVBoxLayout(local)
        local_column.addWidget(self.tree, 1)
        local_column.addWidget(note)
        local_column.addLayout(files)
        self.tabs = QTabWidget()
        self.tabs.addTab(local, "On this machine")
        self.tabs.addTab(self.hub_panel, "Download from Hugging Face")
        column = QVBoxLayout(self)
        column.addWidget(self.tabs, 1)
        column.addWidget(self.error_label)
        column.addWidget(self.buttons)

        self._fill()
        if current_spec:
            self._select_spec(current_spec)
        self.resize(860, 460)

    def _fill(self) -> None:
        """(Re)list the local models, keeping the selection."""
        chosen = self.chosen_spec()
        self.tree.clear()
        try:
            entries = model_catalog(self.data_root, self.on_cpu)
            self._hub_models = {m.spec: m for m in installed.installed_models(self.data_root)}
            self._uses = list(usage.read_uses(self.data_root).values())
            local = list_local_models(self.data_root)
            self._own_models = {m.spec: m for m in local if m.kind in DATA_FOLDER_KINDS}
            self._derived = self._derived_by_spec(local)
        except (OSError, UserError) as exc:
            entries, self._hub_models, self._own_models, self._derived = [], {}, {}, {}
            self._uses = []
            self._show_error(f"Could not list the models in {self.data_root}: {exc}")
        for entry in entries:
            self._add(entry)
        total = sum(m.size_bytes for m in self._hub_models.values())
        made = derived.derived_bytes(self.data_root)
        self.disk_label.setText(
            " · ".join(
                part
                for part in (
                    f"Downloaded from the hub: {len(self._hub_models)} · {file_bytes(total)}"
                    if self._hub_models
                    else "",
                    f"Made from models: {file_bytes(made)}" if made else "",
                )
                if part
            )
        )
        self.clean_button.setEnabled(made > 0)
        self._on_current_changed(None)
        if chosen:
            item = self._item(chosen)
            if item is not None:
                self.tree.setCurrentItem(item)

    def chosen_spec(self) -> str | None:
        item = self.tree.currentItem()
        return item.data(0, SPEC_ROLE) if item is not None else None

    # -- slots --

    def _on_open_gguf(self) -> None:
        path = self._ask_gguf_path()
        if path:
            self._select_spec(path)

    def _on_open_folder(self) -> None:
        path = self._ask_mlx_folder()
        if path:
            self._select_spec(path)

    def _on_current_changed(self, item: QTreeWidgetItem | None) -> None:
        item = self.tree.currentItem()
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(item is not None)
        spec = item.data(0, SPEC_ROLE) if item is not None else None
        deletable = spec in self._hub_models or spec in self._own_models
        self.delete_button.setEnabled(deletable and spec != self.current_spec)

    def _on_downloaded(self, spec: str) -> None:
        """A download finished: list it, select it, so OK loads it."""
        self._fill()
        item = self._item(spec)
        if item is not None:
            self.tree.setCurrentItem(item)
            self.tabs.setCurrentIndex(0)

    def _on_delete(self) -> None:
        spec = self.chosen_spec()
        own = self._own_models.get(spec) if spec else None
        model = own or (self._hub_models.get(spec) if spec else None)
        if model is None or spec == self.current_spec:
            return
        if not self._confirm_delete(spec, model.size_bytes):
            return
        try:
            if own is not None:
                deleted = delete_from_data_folder(self.data_root, own)
            else:
                deleted = installed.delete_model(self.data_root, spec)
        except (OSError, UserError) as exc:
            self._show_error(f"Could not delete {spec}: {exc}")
            return
        self.tree.setCurrentItem(None)
        self._fill()
        self.error_label.hide()
        self.hub_panel.say(
            f"Deleted {spec}: {file_bytes(deleted.freed_bytes)}, and {deleted.kv_sessions} "
            f"cached sessions ({file_bytes(deleted.kv_bytes)})"
        )

    def accept(self) -> None:
        """OK or Enter. On the Download tab it never loads the other tab's model: Enter in
        the search box searches (the box's own returnPressed), Enter on a result downloads
        it. A download goes on after the picker closes."""
        if self.tabs.currentIndex() == 1:
            panel = self.hub_panel
            if not panel.query.hasFocus() and panel.target() and not panel.is_downloading():
                panel.start_download()
            return
        if self.chosen_spec() is not None:
            super().accept()

    def _on_clean(self) -> None:
        made = derived.derived_files(self.data_root)
        size = sum(f.size_bytes for f in made)
        if not made or not self._confirm_clean(size):
            return
        freed = derived.remove(made)
        self._fill()
        self.hub_panel.say(f"Deleted the files made from models: {file_bytes(freed)} freed")

    def _derived_by_spec(self, local: list[LocalModel]) -> dict[str, list[derived.DerivedFile]]:
        found = {}
        for model in local:
            file = model_file(self.data_root, model)
            made = derived.derived_of(self.data_root, file) if file is not None else []
            if made:
                found[model.spec] = made
        return found

    # -- file dialogs (tests replace these) --

    def _ask_gguf_path(self) -> str:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", "", "GGUF models (*.gguf)")
        return path

    def _ask_mlx_folder(self) -> str:
        return QFileDialog.getExistingDirectory(self, "Open an MLX model folder")

    def _confirm_clean(self, size: int) -> bool:
        answer = QMessageBox.question(
            self,
            "Delete derived files",
            f"Delete the files made from models at load ({file_bytes(size)}: tokenizers, "
            "kept conversions)? The next load of each model makes what it needs again.",
        )
        return answer == QMessageBox.StandardButton.Yes

    def _confirm_delete(self, spec: str, size: int) -> bool:
        own = self._own_models.get(spec)
        where = (
            "the Hugging Face cache"
            if own is None
            else f"{self.data_root / 'models'} (picking it again downloads it again)"
            if own.kind == "known-gguf"
            else str(self.data_root / "models")
        )
        answer = QMessageBox.question(
            self,
            "Delete model",
            f"Delete {spec} ({file_bytes(size)}) from {where}, the files made from it and its "
            "cached KV? Chats keep their history.",
        )
        return answer == QMessageBox.StandardButton.Yes

    # -- helpers --

    def _select_spec(self, spec: str) -> None:
        """Select the row of ``spec``; a file or folder not listed yet gets a row of its own."""
        path = Path(spec).expanduser()
        item = self._item(spec) or self._item(str(path))
        if item is None:
            if not path.exists():
                self._show_error(
                    f"{spec} is not on this machine (moved or deleted?): pick another model"
                )
                return
            try:
                item = self._add(entry_for_path(path, self.on_cpu))
            except (OSError, UserError) as exc:
                self._show_error(str(exc))
                return
        if item is not None:
            self.error_label.hide()
            self.tree.setCurrentItem(item)
            self.tree.scrollToItem(item)

    def _add(self, entry: CatalogEntry) -> QTreeWidgetItem:
        kind = KIND_LABELS.get(entry.kind, entry.kind)
        if entry.base:
            kind += f" · {BASE_LABEL}"
        if entry.kind == "known-gguf":
            kind += " · downloaded" if entry.downloaded else " · downloads on first use"
        hub_model = getattr(self, "_hub_models", {}).get(entry.spec)
        when = hub_model.last_used if hub_model else last_use(self._uses, entry)
        last_used = _ago(when)
        made = getattr(self, "_derived", {}).get(entry.spec, [])
        made_bytes = sum(f.size_bytes for f in made)
        item = QTreeWidgetItem(
            [
                entry.name,
                kind,
                file_bytes(entry.size_bytes) + (f" + {file_bytes(made_bytes)}" if made else ""),
                human_bytes(entry.memory_bytes),
                last_used,
            ]
        )
        item.setData(0, SPEC_ROLE, entry.spec)
        if made:
            item.setToolTip(
                2,
                "The model file, and files made from it at load and kept: "
                + ", ".join(f"{f.kind} ({file_bytes(f.size_bytes)})" for f in made)
                + ". They go with the model, or with Delete Derived Files.",
            )
        item.setToolTip(0, "\n".join(text for text in (entry.description, entry.spec) if text))
        if entry.base:
            item.setToolTip(1, BASE_TIP)
        for column in (2, 3):
            item.setTextAlignment(
                column, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
            )
        self.tree.addTopLevelItem(item)
        return item

    def _item(self, spec: str) -> QTreeWidgetItem | None:
        for row in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(row)
            if item.data(0, SPEC_ROLE) == spec:
                return item
        return None

    def _memory_note(self) -> str:
        if self.on_cpu:
            return (
                "Memory: the weights once loaded. MLX's CPU backend runs them as float32, "
                "so a 4-bit model takes about 7 times its file size."
            )
        return "Memory: the weights once loaded; they stay as stored, about the file size."

    def _show_error(self, message: str) -> None:
        self.error_label.setText(message)
        self.error_label.show()


def last_use(uses: list, entry: CatalogEntry) -> float | None:
    """When the model of ``entry`` was last loaded (``core.models.usage``), None if never:
    a load under its spec, of its path, or (a known model) of its file."""
    known = KNOWN_MODELS.get(entry.spec)
    times = [
        use.last_used
        for use in uses
        if use.spec == entry.spec
        or use.path == entry.spec
        or (known is not None and Path(use.path).name == known.filename)
    ]
    return max(times, default=None)


def _ago(timestamp: float | None) -> str:
    import time

    if timestamp is None:
        return "never"
    seconds = max(0.0, time.time() - timestamp)
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"
