"""The model info card (Model › Model Info…): what the loaded model is (architecture,
parameters, quantization in its file and in memory, context length, base or instruct, the
license its files name, where it is, its chat template, viewable) and what the cache holds
for it now (in RAM, on disk).

Its facts come from the engine's ``ModelInfo`` (plain values) and from the model's files,
read here without loading anything (``core.models.describe``); the cache's from the last
``EngineStats`` the panels got."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.format import count, human_bytes
from core.engine.engine_stats import EngineStats
from core.errors import UserError
from core.models.base_models import BASE_LABEL
from core.models.describe import ModelDescription, describe_model


def card_rows(info, description: ModelDescription | None, stats: EngineStats | None) -> dict:
    """The card's rows, label -> text (plain values: the tests read them)."""
    file = description if description is not None else ModelDescription(format="")
    kind = f"base ({BASE_LABEL})" if info.base else "instruct (chat)"
    quant = file.quantization or "—"
    rows = {
        "Name": info.name,
        "Architecture": info.model_type,
        "Parameters": _parameters(file.parameter_count or info.parameters),
        "Layers": str(info.num_layers),
        "Quantization": f"{quant} in its file · {info.weights_format} in memory "
        f"({human_bytes(info.weight_bytes)})",
        "Context length": f"{count(info.context_length)} tokens",
        "Kind": kind,
        "License": file.license or "not stated in its files",
        "File": info.path,
        "Fingerprint": info.fingerprint,
        "Chat template": f"{len(info.chat_template):,} characters"
        if info.chat_template
        else "none (a fallback template)",
    }
    rows["Cache"] = _cache(stats)
    return rows


def _parameters(n: int | None) -> str:
    if not n:
        return "—"
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def _cache(stats: EngineStats | None) -> str:
    if stats is None or stats.cache is None:
        return "—"
    cache = stats.cache
    if not cache.enabled:
        return f"off ({cache.disabled_reason or 'disabled'})"
    ram = (
        f"in RAM {count(cache.tree_tokens)} tokens of {count(cache.sessions)} "
        f"chat{'s' if cache.sessions != 1 else ''}"
    )
    if stats.disk is None:
        return ram + " · no disk cache"
    disk = stats.disk.indexed_pages * cache.page_size
    return f"{ram} · on disk about {count(disk)} tokens ({count(stats.disk.indexed_pages)} pages)"


class ModelCardDialog(QDialog):
    def __init__(self, info, stats: EngineStats | None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(f"{info.name} — Model Info")
        self.info = info
        try:
            description = describe_model(info.path)
        except UserError:
            description = None  # a model that is no file (a test's): its files say nothing
        self.rows = card_rows(info, description, stats)
        form = QFormLayout()
        self.values: dict[str, QLabel] = {}
        for label, text in self.rows.items():
            value = QLabel(text)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            value.setWordWrap(True)
            form.addRow(f"{label}:", value)
            self.values[label] = value
        self.template_button = QPushButton("View Chat Template…")
        self.template_button.setEnabled(bool(info.chat_template))
        self.template_button.clicked.connect(self.show_template)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.addButton(self.template_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        column = QVBoxLayout(self)
        column.addLayout(form)
        column.addWidget(buttons)
        self.template_view: QDialog | None = None
        self.resize(560, self.sizeHint().height())

    def show_template(self) -> None:
        """The chat template, read-only, in a window of its own."""
        view = QDialog(self)
        view.setWindowTitle(f"{self.info.name} — Chat Template")
        text = QPlainTextEdit(self.info.chat_template)
        text.setObjectName("templateText")
        text.setReadOnly(True)
        text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        column = QVBoxLayout(view)
        column.addWidget(text)
        view.resize(720, 520)
        view.show()
        self.template_view = view
