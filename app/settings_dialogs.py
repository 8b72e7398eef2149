"""The app's own settings (kept in QSettings) and Preferences.

``AppSettings`` is the typed face of QSettings; ``AppSettingsDialog`` (Preferences) edits
the part of it that takes effect at the next start (data folder, memory budgets) and says
so. A chat's own settings: :mod:`app.chat_settings`.
"""

from __future__ import annotations

import json

from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.chat_settings import ChatPreset
from core.engine.config import EngineConfig
from core.paths import GB, MB, default_disk_budget, gb_to_bytes

DEFAULT_API_PORT = 8000
OLLAMA_PORT = 11434  # where Ollama listens, and apps that speak only its API look
# Preferences' KV precision choices: (label, bits; 0: the model's own precision); the engine
# configuration checks the values (kvcache.kv_format), the app passes them on as plain numbers
KV_PRECISIONS = (("Full (the model's own)", 0), ("8-bit", 8), ("4-bit", 4))
KV_GROUP_SIZES = (32, 64, 128)
DEFAULT_KV_GROUP = 64


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

    @property
    def kv_bits(self) -> int | None:
        """Bits the cached K/V are stored in (8 or 4); None: the model's own precision."""
        return self._get("kv_bits", int) or None

    @kv_bits.setter
    def kv_bits(self, value: int | None) -> None:
        self._set("kv_bits", value or None)

    @property
    def kv_group_size(self) -> int | None:
        """Values per quantization group with ``kv_bits``; None: the engine's default (64)."""
        return self._get("kv_group_size", int) or None

    @kv_group_size.setter
    def kv_group_size(self, value: int | None) -> None:
        self._set("kv_group_size", value or None)

    def engine_config(
        self, kv_bits: int | None = None, kv_group_size: int | None = None
    ) -> EngineConfig:
        """The engine's configuration these settings choose (the engine's defaults for the
        rest); ``kv_bits`` and ``kv_group_size``, where given (the command line's), go over
        the Preferences' KV precision."""
        bits = self.kv_bits
        return EngineConfig(
            kv_bits=kv_bits or bits,
            kv_group_size=kv_group_size or (self.kv_group_size if bits else None),
            pool_bytes=self.kv_pool_mb * MB if self.kv_pool_mb else None,
            disk_budget_bytes=gb_to_bytes(self.disk_cache_gb) if self.disk_cache_gb else None,
        )

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
    def presets(self) -> dict[str, ChatPreset]:
        """The chat settings presets by name (Chat Settings saves and applies them)."""
        presets = (ChatPreset.from_json(v) for v in self._get_json("chat/presets", list))
        return {p.name: p for p in presets if p is not None}

    @presets.setter
    def presets(self, value: dict[str, ChatPreset]) -> None:
        self._set_json("chat/presets", [p.to_json() for p in value.values()] or None)

    @property
    def new_chat_defaults(self) -> ChatPreset | None:
        """What a new chat starts with; None: a copy of the chat open at the time."""
        return ChatPreset.from_json(self._get_json("chat/new_chat_defaults", dict))

    @new_chat_defaults.setter
    def new_chat_defaults(self, value: ChatPreset | None) -> None:
        self._set_json("chat/new_chat_defaults", value.to_json() if value is not None else None)

    @property
    def api_port(self) -> int:
        """Where "Serve API" listens (8000 unless set; 0: any free port)."""
        port = self._get("api/port", int)
        return DEFAULT_API_PORT if port is None else port

    @api_port.setter
    def api_port(self, value: int | None) -> None:
        self._set("api/port", None if value == DEFAULT_API_PORT else value)

    @property
    def api_ollama_port(self) -> int | None:
        """Where "Serve API" also listens for Ollama's clients (None: nowhere else)."""
        port = self._get("api/ollama_port", int)
        return port if port else None

    @api_ollama_port.setter
    def api_ollama_port(self, value: int | None) -> None:
        self._set("api/ollama_port", value or None)

    @property
    def api_keys(self) -> list[str]:
        """The keys "Serve API" asks for (none: it takes requests without one)."""
        return [key for key in self._get_json("api/keys", list) if isinstance(key, str) and key]

    @api_keys.setter
    def api_keys(self, value: list[str]) -> None:
        self._set_json("api/keys", list(value) or None)

    @property
    def api_origins(self) -> list[str]:
        """Web pages (origins) allowed to call the API from a browser."""
        return [o for o in self._get_json("api/origins", list) if isinstance(o, str) and o]

    @api_origins.setter
    def api_origins(self, value: list[str]) -> None:
        self._set_json("api/origins", list(value) or None)

    @property
    def api_on_network(self) -> bool:
        """Serve on every network interface (a key is then needed), not only 127.0.0.1."""
        return bool(self._get("api/network", int))

    @api_on_network.setter
    def api_on_network(self, value: bool) -> None:
        self._set("api/network", 1 if value else None)

    @property
    def panels_hidden(self) -> bool:
        """View > Show Panels was unticked: the memory and cache panels are hidden."""
        return bool(self._get("window/panels_hidden", int))

    @panels_hidden.setter
    def panels_hidden(self, value: bool) -> None:
        self._set("window/panels_hidden", 1 if value else None)

    @property
    def mcp_acknowledged(self) -> set[str]:
        """MCP servers whose tool list the user has seen and accepted (a chat's first use)."""
        return {name for name in self._get_json("mcp/acknowledged", list) if isinstance(name, str)}

    @mcp_acknowledged.setter
    def mcp_acknowledged(self, value: set[str]) -> None:
        self._set_json("mcp/acknowledged", sorted(value) or None)

    @property
    def collapsed_panels(self) -> set[str]:
        """The live panels folded to their one-line summary ("memory", "cache")."""
        return {name for name in self._get_json("window/collapsed", list) if isinstance(name, str)}

    @collapsed_panels.setter
    def collapsed_panels(self, value: set[str]) -> None:
        self._set_json("window/collapsed", sorted(value) or None)

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

    def _get_json(self, key: str, kind: type):
        """A JSON value of type ``kind`` (an empty one when missing or not JSON of that type)."""
        text = self._get(key, str)
        try:
            value = json.loads(text) if text else kind()
        except ValueError:
            return kind()
        return value if isinstance(value, kind) else kind()

    def _set_json(self, key: str, value: object) -> None:
        self._set(key, None if value is None else json.dumps(value))

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
        pages: tuple[tuple[str, QWidget], ...] = (),
    ):
        """``pages``: more pages (title, widget) after General's, e.g. the MCP servers."""
        super().__init__(parent)
        self.setWindowTitle("RadixChat settings")
        self.settings = settings
        self.changed: list[str] = []  # what the last apply() changed
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
        self.kv_precision = QComboBox()
        for label, bits in KV_PRECISIONS:
            self.kv_precision.addItem(label, bits)
        self.kv_precision.setCurrentIndex(max(0, self.kv_precision.findData(settings.kv_bits or 0)))
        self.kv_precision.setToolTip(
            "How cached keys and values are stored. 8-bit holds about twice the tokens in "
            "the same RAM and disk, 4-bit about four times; replies can differ slightly from "
            "full precision (radixchat bench kv-quality measures how much). Sliding-window "
            "and recurrent layers keep their own precision."
        )
        self.kv_group_size = QComboBox()
        for size in KV_GROUP_SIZES:
            self.kv_group_size.addItem(f"{size} values", size)
        self.kv_group_size.setCurrentIndex(
            max(0, self.kv_group_size.findData(settings.kv_group_size or DEFAULT_KV_GROUP))
        )
        self.kv_group_size.setToolTip(
            "Values that share one scale and bias: smaller groups are a little more exact "
            "and a little larger"
        )
        self.kv_precision.currentIndexChanged.connect(self._on_precision)
        self._on_precision()
        width = max(box.sizeHint().width() for box in (self.kv_pool_mb, self.disk_cache_gb))
        for box in (self.kv_pool_mb, self.disk_cache_gb):
            box.setMinimumWidth(width)

        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.ExpandingFieldsGrow)
        form.addRow("Data folder:", folder_row)
        form.addRow("KV pool RAM budget:", self.kv_pool_mb)
        form.addRow("Disk cache budget:", self.disk_cache_gb)
        form.addRow("KV precision:", self.kv_precision)
        form.addRow("KV group size:", self.kv_group_size)
        note = QLabel("These apply the next time RadixChat starts.")
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        column = QVBoxLayout(self)
        if pages:
            self.tabs = QTabWidget()
            general = QWidget()
            inside = QVBoxLayout(general)
            inside.addLayout(form)
            inside.addWidget(note)
            inside.addStretch(1)
            self.tabs.addTab(general, "General")
            for title, page in pages:
                self.tabs.addTab(page, title)
            column.addWidget(self.tabs, 1)
        else:
            column.addLayout(form)
            column.addWidget(note)
        column.addWidget(buttons)
        self.resize(max(520, self.sizeHint().width()), self.sizeHint().height())

    def apply(self) -> list[str]:
        """Write the fields into the settings (empty / special values: None); returns what
        changed, in words, for the window to say it waits for a restart."""
        before = self._applied()
        self.settings.data_dir = self.data_dir.text().strip() or None
        self.settings.kv_pool_mb = self.kv_pool_mb.value() or None
        self.settings.disk_cache_gb = self.disk_cache_gb.value() or None
        self.settings.kv_bits = self.kv_precision.currentData() or None
        group = self.kv_group_size.currentData()
        self.settings.kv_group_size = group if group != DEFAULT_KV_GROUP else None
        self.settings.sync()
        after = self._applied()
        names = (
            "the data folder",
            "the KV pool budget",
            "the disk cache budget",
            "the KV precision",
        )
        self.changed = [name for name, old, new in zip(names, before, after) if old != new]
        return self.changed

    def _applied(self) -> tuple:
        s = self.settings
        kv = (s.kv_bits, s.kv_group_size if s.kv_bits else None)
        return s.data_dir, s.kv_pool_mb, s.disk_cache_gb, kv

    def _on_precision(self) -> None:
        self.kv_group_size.setEnabled(bool(self.kv_precision.currentData()))

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
