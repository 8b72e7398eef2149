"""The model picker: known models, local GGUF files and MLX folders, with the memory
each will take; or any .gguf file or MLX folder on disk."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QAbstractItemView, QDialog, QDialogButtonBox, QFileDialog, QHBoxLayout, QHeaderView,
                               QLabel, QPushButton, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget)

from app.format import human_bytes
from core.errors import UserError
from core.models.catalog import CatalogEntry, entry_for_path, model_catalog, runs_on_cpu

COLUMNS = ("Name", "Kind", "Size", "Memory")
KIND_LABELS = {"known-gguf": "GGUF", "gguf": "GGUF", "mlx-dir": "MLX folder", "hf-cache": "Hugging Face cache"}
SPEC_ROLE = Qt.ItemDataRole.UserRole


class ModelPickerDialog(QDialog):
    """Pick the model to load. ``chosen_spec()`` is what the loader takes: a known
    model's name, a path, or a Hugging Face repo id.

    ``current_spec`` is preselected (added as a row when it is a file or folder the
    list does not show). ``on_cpu``: whether the memory column assumes MLX's CPU
    backend (float32 weights); by default, everywhere but macOS."""

    def __init__(self, data_root: Path, current_spec: str | None = None, parent: QWidget | None = None,
                 on_cpu: bool | None = None):
        super().__init__(parent)
        self.setWindowTitle("Choose a model")
        self.on_cpu = runs_on_cpu() if on_cpu is None else on_cpu

        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setRootIsDecorated(False)
        self.tree.setUniformRowHeights(True)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.tree.headerItem().setToolTip(3, self._memory_note())
        for column in (2, 3):
            self.tree.headerItem().setTextAlignment(column, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
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
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        row = QHBoxLayout()
        row.addWidget(self.gguf_button)
        row.addWidget(self.folder_button)
        row.addStretch()
        row.addWidget(self.buttons)
        column = QVBoxLayout(self)
        column.addWidget(self.tree, 1)
        column.addWidget(note)
        column.addWidget(self.error_label)
        column.addLayout(row)

        try:
            entries = model_catalog(Path(data_root), self.on_cpu)
        except (OSError, UserError) as exc:
            entries = []
            self._show_error(f"Could not list the models in {data_root}: {exc}")
        for entry in entries:
            self._add(entry)
        self._on_current_changed(None)
        if current_spec:
            self._select_spec(current_spec)
        self.resize(720, 380)

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
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(item is not None)

    # -- file dialogs (tests replace these) --

    def _ask_gguf_path(self) -> str:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", "", "GGUF models (*.gguf)")
        return path

    def _ask_mlx_folder(self) -> str:
        return QFileDialog.getExistingDirectory(self, "Open an MLX model folder")

    # -- helpers --

    def _select_spec(self, spec: str) -> None:
        """Select the row of ``spec``; a file or folder not listed yet gets a row of its own."""
        path = Path(spec).expanduser()
        item = self._item(spec) or self._item(str(path))
        if item is None:
            if not path.exists():
                self._show_error(f"{spec} is not on this machine (moved or deleted?): pick another model")
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
        if entry.kind == "known-gguf":
            kind += " · downloaded" if entry.downloaded else " · downloads on first use"
        item = QTreeWidgetItem([entry.name, kind, human_bytes(entry.size_bytes), human_bytes(entry.memory_bytes)])
        item.setData(0, SPEC_ROLE, entry.spec)
        item.setToolTip(0, "\n".join(text for text in (entry.description, entry.spec) if text))
        for column in (2, 3):
            item.setTextAlignment(column, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
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
            return ("Memory: the weights once loaded. MLX's CPU backend runs them as float32, "
                    "so a 4-bit model takes about 7 times its file size.")
        return "Memory: the weights once loaded; they stay as stored, about the file size."

    def _show_error(self, message: str) -> None:
        self.error_label.setText(message)
        self.error_label.show()
