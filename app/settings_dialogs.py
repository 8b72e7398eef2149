"""Settings: a chat's sampling and system prompt, and the app's own (kept in QSettings).

``SessionSettingsDialog`` edits one chat's settings dict (the store's ``settings``) and
system prompt. ``AppSettings`` is the typed face of QSettings; ``AppSettingsDialog``
edits the part of it that takes effect at the next start (data folder, memory budgets).
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from core.engine.types import SamplingParams
from core.paths import GB, MB, default_disk_budget, gb_to_bytes

# what a chat's settings edit
SESSION_SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "seed")
# a new chat's sampling: the engine's defaults (SamplingParams' fields), not a copy of them
DEFAULT_SAMPLING = {key: getattr(SamplingParams(), key) for key in SESSION_SAMPLING_KEYS}
MAX_TOKENS_LIMIT = 32768
MAX_SEED = 2**31 - 1
RANDOM_SEED_TEXT = "random"


class SessionSettingsDialog(QDialog):
    """One chat's system prompt and sampling (temperature, top-p, max tokens, seed).

    ``values()`` gives back ``(settings, system_prompt)``: the settings dict it was given
    (other keys kept) with the four edited, and None for an empty system prompt."""

    def __init__(self, settings: dict, system_prompt: str | None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self._settings = dict(settings)

        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("No system prompt: the model's own default")
        self.system_prompt.setPlainText(system_prompt or "")
        self.system_prompt.setMinimumHeight(self.fontMetrics().lineSpacing() * 5 + 12)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setDecimals(2)
        self.temperature.setToolTip("Randomness of the reply: 0 always picks the likeliest token")
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.01, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setDecimals(2)
        self.top_p.setToolTip(
            "Sample only from the likeliest tokens that together have this probability"
        )
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, MAX_TOKENS_LIMIT)
        self.max_tokens.setSingleStep(64)
        self.max_tokens.setToolTip("The longest reply, in tokens")
        self.seed = QSpinBox()
        self.seed.setRange(-1, MAX_SEED)  # the minimum is the special value: no seed
        self.seed.setSpecialValueText(RANDOM_SEED_TEXT)
        self.seed.setToolTip(
            "The same seed and settings give the same reply; “random” differs each time"
        )
        self._show(self._settings)
        width = max(
            box.sizeHint().width()
            for box in (self.temperature, self.top_p, self.max_tokens, self.seed)
        )
        for box in (self.temperature, self.top_p, self.max_tokens, self.seed):
            box.setMinimumWidth(width)  # one column of equal boxes

        form = QFormLayout()
        # numbers stay narrow
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.ExpandingFieldsGrow)
        form.addRow("System prompt:", self.system_prompt)
        form.addRow("Temperature:", self.temperature)
        form.addRow("Top-p:", self.top_p)
        form.addRow("Max tokens:", self.max_tokens)
        form.addRow("Seed:", self.seed)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok
            | QDialogButtonBox.StandardButton.Cancel
            | QDialogButtonBox.StandardButton.RestoreDefaults
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(
            self.restore_defaults
        )
        self.buttons = buttons
        column = QVBoxLayout(self)
        column.addLayout(form)
        column.addWidget(buttons)
        self.resize(460, self.sizeHint().height())

    def values(self) -> tuple[dict, str | None]:
        seed = self.seed.value()
        settings = {
            **self._settings,
            "temperature": round(self.temperature.value(), 2),
            "top_p": round(self.top_p.value(), 2),
            "max_tokens": self.max_tokens.value(),
            "seed": None if seed == self.seed.minimum() else seed,
        }
        prompt = self.system_prompt.toPlainText()
        return settings, (prompt if prompt.strip() else None)

    def restore_defaults(self) -> None:
        """The default sampling; the system prompt stays."""
        self._show(DEFAULT_SAMPLING)

    def _show(self, settings: dict) -> None:
        value = {
            **DEFAULT_SAMPLING,
            **{k: v for k, v in settings.items() if v is not None or k == "seed"},
        }
        self.temperature.setValue(float(value["temperature"]))
        self.top_p.setValue(float(value["top_p"]))
        self.max_tokens.setValue(int(value["max_tokens"]))
        self.seed.setValue(self.seed.minimum() if value["seed"] is None else int(value["seed"]))


class AppSettings:
    """The app's settings in QSettings (organization and application "RadixChat").

    ``None`` means "not set: use the default" and removes the key. Pass a QSettings
    (e.g. an ini file) to keep them elsewhere."""

    def __init__(self, settings: QSettings | None = None):
        self.qsettings = settings if settings is not None else QSettings("RadixChat", "RadixChat")

    @property
    def data_dir(self) -> str | None:
        return self._get("data_dir", str) or None

    @data_dir.setter
    def data_dir(self, value: str | None) -> None:
        self._set("data_dir", value or None)

    @property
    def kv_pool_mb(self) -> int | None:
        """The KV pool's RAM budget in MB; None: sized from free memory."""
        return self._get("kv_pool_mb", int)

    @kv_pool_mb.setter
    def kv_pool_mb(self, value: int | None) -> None:
        self._set("kv_pool_mb", value)

    @property
    def disk_cache_gb(self) -> float | None:
        """The disk cache's budget in GB (``core.paths.GB`` bytes each); None: the default
        budget."""
        return self._get("disk_cache_gb", float)

    @disk_cache_gb.setter
    def disk_cache_gb(self, value: float | None) -> None:
        self._set("disk_cache_gb", value)

    def engine_options(self) -> dict:
        """The Engine's keyword arguments these settings choose (none: the engine's defaults)."""
        options = {}
        if self.kv_pool_mb:
            options["pool_bytes"] = self.kv_pool_mb * MB
        if self.disk_cache_gb:
            options["disk_budget_bytes"] = gb_to_bytes(self.disk_cache_gb)
        return options

    @property
    def last_model(self) -> str | None:
        return self._get("last_model", str) or None

    @last_model.setter
    def last_model(self, value: str | None) -> None:
        self._set("last_model", value or None)

    @property
    def group_hostfile(self) -> str | None:
        """The hostfile last used to serve over several Macs."""
        return self._get("group_hostfile", str) or None

    @group_hostfile.setter
    def group_hostfile(self, value: str | None) -> None:
        self._set("group_hostfile", value or None)

    @property
    def last_session(self) -> int | None:
        """The chat that was open when the app last closed (reopened at start)."""
        return self._get("last_session", int) or None

    @last_session.setter
    def last_session(self, value: int | None) -> None:
        self._set("last_session", value or None)

    @property
    def window_geometry(self) -> bytes | None:
        return self._get_bytes("window/geometry")

    @window_geometry.setter
    def window_geometry(self, value: bytes | None) -> None:
        self._set("window/geometry", None if value is None else QByteArray(bytes(value)))

    @property
    def window_state(self) -> bytes | None:
        return self._get_bytes("window/state")

    @window_state.setter
    def window_state(self, value: bytes | None) -> None:
        self._set("window/state", None if value is None else QByteArray(bytes(value)))

    @property
    def splitter_state(self) -> bytes | None:
        return self._get_bytes("window/splitter")

    @splitter_state.setter
    def splitter_state(self, value: bytes | None) -> None:
        self._set("window/splitter", None if value is None else QByteArray(bytes(value)))

    def sync(self) -> None:
        """Write to disk now (QSettings also does it by itself, later)."""
        self.qsettings.sync()

    def _get(self, key: str, kind: type):
        if not self.qsettings.contains(key):
            return None
        try:
            return kind(self.qsettings.value(key))
        except (TypeError, ValueError):  # edited by hand into nonsense: the default
            return None

    def _get_bytes(self, key: str) -> bytes | None:
        if not self.qsettings.contains(key):
            return None
        value = self.qsettings.value(key)
        return bytes(value.data()) if isinstance(value, QByteArray) else None

    def _set(self, key: str, value: object) -> None:
        if value is None:
            self.qsettings.remove(key)
        else:
            self.qsettings.setValue(key, value)


class AppSettingsDialog(QDialog):
    """The data folder and the memory budgets; they apply at the next start.

    ``default_data_dir`` is shown for an empty data folder field; OK (or ``apply()``)
    writes the fields into ``settings``."""

    def __init__(
        self,
        settings: AppSettings,
        default_data_dir: str,
        default_disk_cache_gb: float | None = None,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle("RadixChat settings")
        self.settings = settings
        if default_disk_cache_gb is None:
            default_disk_cache_gb = default_disk_budget() / GB

        self.data_dir = QLineEdit(settings.data_dir or "")
        self.data_dir.setPlaceholderText(f"Default: {default_data_dir}")
        self.data_dir.setClearButtonEnabled(True)
        self.data_dir.setToolTip("Where models, chats and the KV cache live; empty: the default")
        self.browse_button = QPushButton("Browse…")
        self.browse_button.clicked.connect(self._on_browse)
        folder_row = QHBoxLayout()
        folder_row.addWidget(self.data_dir, 1)
        folder_row.addWidget(self.browse_button)

        self.kv_pool_mb = QSpinBox()
        self.kv_pool_mb.setRange(0, 1 << 20)  # 0 is the special value: automatic
        self.kv_pool_mb.setSingleStep(256)
        self.kv_pool_mb.setSuffix(" MB")
        self.kv_pool_mb.setSpecialValueText("Automatic")
        self.kv_pool_mb.setToolTip("RAM for cached prompt KV; Automatic: a share of free memory")
        self.kv_pool_mb.setValue(settings.kv_pool_mb or 0)
        self.disk_cache_gb = QDoubleSpinBox()
        self.disk_cache_gb.setRange(0.0, 100_000.0)  # 0 is the special value: the default
        self.disk_cache_gb.setDecimals(1)
        self.disk_cache_gb.setSingleStep(1.0)
        self.disk_cache_gb.setSuffix(" GB")
        self.disk_cache_gb.setSpecialValueText(f"Default ({default_disk_cache_gb:g} GB)")
        self.disk_cache_gb.setToolTip("Disk space for saved chat KV; the oldest pages go first")
        self.disk_cache_gb.setValue(settings.disk_cache_gb or 0.0)
        width = max(box.sizeHint().width() for box in (self.kv_pool_mb, self.disk_cache_gb))
        for box in (self.kv_pool_mb, self.disk_cache_gb):
            box.setMinimumWidth(width)

        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.ExpandingFieldsGrow)
        form.addRow("Data folder:", folder_row)
        form.addRow("KV pool RAM budget:", self.kv_pool_mb)
        form.addRow("Disk cache budget:", self.disk_cache_gb)
        note = QLabel("Changes apply the next time RadixChat starts.")
        note.setEnabled(False)  # dim
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        column = QVBoxLayout(self)
        column.addLayout(form)
        column.addWidget(note)
        column.addWidget(buttons)
        self.resize(max(520, self.sizeHint().width()), self.sizeHint().height())

    def apply(self) -> None:
        """Write the fields into the settings (empty / special values: None)."""
        self.settings.data_dir = self.data_dir.text().strip() or None
        self.settings.kv_pool_mb = self.kv_pool_mb.value() or None
        self.settings.disk_cache_gb = self.disk_cache_gb.value() or None
        self.settings.sync()

    def accept(self) -> None:
        self.apply()
        super().accept()

    def _on_browse(self) -> None:
        folder = self._ask_directory(
            self.data_dir.text() or self.data_dir.placeholderText().removeprefix("Default: ")
        )
        if folder:
            self.data_dir.setText(folder)

    def _ask_directory(self, start: str) -> str:
        return QFileDialog.getExistingDirectory(self, "Choose the data folder", start)
