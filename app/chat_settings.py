"""A chat's settings: its system prompt and sampling, named presets of both, and the
default a new chat starts with.

``SessionSettingsDialog`` edits one chat's settings dict (the store's ``settings``) and system
prompt. A :class:`ChatPreset` is a named pair of the two, kept in the app's settings
(``AppSettings.presets``); the dialog applies one, saves the fields as one, deletes one, and
can make its fields the default of new chats (``AppSettings.new_chat_defaults``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QInputDialog,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from core.chats.settings import RANGES, SAMPLING_KEYS, sampling_settings, usable
from core.engine.types import SamplingParams

# a new chat's sampling: the engine's defaults (SamplingParams' fields), not a copy of them
DEFAULT_SAMPLING = sampling_settings(SamplingParams())
MAX_TOKENS_LIMIT = int(RANGES["max_tokens"].high)
MAX_TOP_K = int(RANGES["top_k"].high)
MAX_SEED = int(RANGES["seed"].high)
RANDOM_SEED_TEXT = "random"
NO_PRESET = "Custom"


@dataclass(frozen=True)
class ChatPreset:
    """A named system prompt and sampling (SAMPLING_KEYS), kept as JSON in QSettings."""

    name: str
    system_prompt: str | None = None
    sampling: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "system_prompt": self.system_prompt, "sampling": self.sampling}

    @classmethod
    def from_json(cls, value: object) -> ChatPreset | None:
        """A preset read back, or None for something edited by hand into nonsense."""
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        prompt, sampling = value.get("system_prompt"), value.get("sampling")
        sampling = {
            k: v
            for k, v in (sampling if isinstance(sampling, dict) else {}).items()
            if k in SAMPLING_KEYS and (v is None or isinstance(v, int | float))
        }
        return cls(value["name"], prompt if isinstance(prompt, str) else None, sampling)


def same(one: ChatPreset, other: ChatPreset) -> bool:
    """The same system prompt and sampling (names aside; sampling as the dialog shows it)."""
    if (one.system_prompt or None) != (other.system_prompt or None):
        return False
    full = (
        {**DEFAULT_SAMPLING, **usable(one.sampling)},
        {**DEFAULT_SAMPLING, **usable(other.sampling)},
    )
    return all(_close(full[0].get(k), full[1].get(k)) for k in SAMPLING_KEYS)


def _close(a: object, b: object) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return round(float(a), 2) == round(float(b), 2)
    return a == b


class PresetStore:
    """Where the dialog keeps presets and the new-chat default: ``AppSettings`` in the app
    (this plain one, in memory, for a dialog opened without it)."""

    def __init__(self) -> None:
        self.presets: dict[str, ChatPreset] = {}
        self.new_chat_defaults: ChatPreset | None = None


class SessionSettingsDialog(QDialog):
    """One chat's system prompt and sampling (temperature, top-p, top-k, min-p, repetition
    penalty, max tokens, seed), with presets.

    ``values()`` gives back ``(settings, system_prompt)``: the settings dict it was given
    (other keys kept) with the edited ones, and None for an empty system prompt. On OK with
    "Use for new chats" ticked, the fields become the new-chat default in ``presets``."""

    def __init__(
        self,
        settings: dict,
        system_prompt: str | None,
        parent: QWidget | None = None,
        presets: PresetStore | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self._settings = dict(settings)
        self.store = presets if presets is not None else PresetStore()

        self.preset = QComboBox()
        self.preset.setToolTip("Apply a saved system prompt and sampling")
        self.save_preset_button = QPushButton("Save as Preset…")
        self.save_preset_button.setToolTip("Keep these fields under a name, for any chat")
        self.save_preset_button.clicked.connect(self._on_save_preset)
        self.delete_preset_button = QPushButton("Delete Preset")
        self.delete_preset_button.clicked.connect(self._on_delete_preset)
        self._fill_presets(NO_PRESET)
        self.preset.activated.connect(self._on_preset_chosen)

        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("No system prompt: the model's own default")
        self.system_prompt.setPlainText(system_prompt or "")
        self.system_prompt.setMinimumHeight(self.fontMetrics().lineSpacing() * 5 + 12)
        self.temperature = _number("temperature", 0.1, 2)
        self.temperature.setToolTip("Randomness of the reply: 0 always picks the likeliest token")
        self.top_p = _number("top_p", 0.05, 2)
        self.top_p.setToolTip(
            "Sample only from the likeliest tokens that together have this probability"
        )
        self.top_k = QSpinBox()
        self.top_k.setRange(0, MAX_TOP_K)
        self.top_k.setSpecialValueText("off")
        self.top_k.setToolTip("Sample only from this many likeliest tokens; off: all of them")
        self.min_p = _number("min_p", 0.01, 2)
        self.min_p.setSpecialValueText("off")
        self.min_p.setToolTip(
            "Drop tokens less likely than this share of the likeliest one; off: keep them"
        )
        self.repetition_penalty = _number("repetition_penalty", 0.05, 2)
        self.repetition_penalty.setSpecialValueText("off")
        self.repetition_penalty.setToolTip(
            "Make tokens already in the reply less likely: 1.1 stops most small models "
            "from looping; off (1.0): no penalty"
        )
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(int(RANGES["max_tokens"].low), MAX_TOKENS_LIMIT)
        self.max_tokens.setSingleStep(64)
        self.max_tokens.setToolTip("The longest reply, in tokens")
        self.seed = QSpinBox()
        self.seed.setRange(-1, MAX_SEED)  # the minimum is the special value: no seed
        self.seed.setSpecialValueText(RANDOM_SEED_TEXT)
        self.seed.setToolTip(
            "The same seed and settings give the same reply; “random” differs each time"
        )
        self.for_new_chats = QCheckBox("Use these settings for new chats")
        self.for_new_chats.setToolTip(
            "New chats start with this system prompt and sampling (otherwise: a copy of the "
            "chat open at the time)"
        )
        self._show(self._settings)
        boxes = self._boxes()
        width = max(box.sizeHint().width() for box in boxes)
        for box in boxes:
            box.setMinimumWidth(width)  # one column of equal boxes

        preset_row = QHBoxLayout()
        preset_row.addWidget(self.preset, 1)
        preset_row.addWidget(self.save_preset_button)
        preset_row.addWidget(self.delete_preset_button)
        form = QFormLayout()
        # numbers stay narrow
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.ExpandingFieldsGrow)
        form.addRow("Preset:", preset_row)
        form.addRow("System prompt:", self.system_prompt)
        form.addRow("Temperature:", self.temperature)
        form.addRow("Top-p:", self.top_p)
        form.addRow("Top-k:", self.top_k)
        form.addRow("Min-p:", self.min_p)
        form.addRow("Repetition penalty:", self.repetition_penalty)
        form.addRow("Max tokens:", self.max_tokens)
        form.addRow("Seed:", self.seed)
        form.addRow("", self.for_new_chats)
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
        self.resize(520, self.sizeHint().height())
        self._tell_the_truth()

    def _tell_the_truth(self) -> None:
        """Open on what the chat uses (issue 45.7: a chat made from the new-chat default
        opened as "Custom" with "Use for new chats" unticked): the preset whose system prompt
        and sampling the fields equal, and the box ticked when they are the new-chat
        default."""
        current = self.current_preset("")
        named = [
            name for name, preset in sorted(self.store.presets.items()) if same(preset, current)
        ]
        if named:
            self.preset.setCurrentText(named[0])
            self.delete_preset_button.setEnabled(True)
        default = self.store.new_chat_defaults
        self.for_new_chats.setChecked(default is not None and same(default, current))

    def values(self) -> tuple[dict, str | None]:
        seed = self.seed.value()
        settings = {
            **self._settings,
            "temperature": round(self.temperature.value(), 2),
            "top_p": round(self.top_p.value(), 2),
            "top_k": self.top_k.value(),
            "min_p": round(self.min_p.value(), 2),
            "repetition_penalty": round(self.repetition_penalty.value(), 2),
            "max_tokens": self.max_tokens.value(),
            "seed": None if seed == self.seed.minimum() else seed,
        }
        prompt = self.system_prompt.toPlainText()
        return settings, (prompt if prompt.strip() else None)

    def current_preset(self, name: str) -> ChatPreset:
        """The fields as a preset named ``name``."""
        settings, prompt = self.values()
        return ChatPreset(name, prompt, {k: settings[k] for k in SAMPLING_KEYS})

    def accept(self) -> None:
        if self.for_new_chats.isChecked():
            self.store.new_chat_defaults = self.current_preset("new chats")
        super().accept()

    def restore_defaults(self) -> None:
        """The default sampling; the system prompt stays."""
        self._show(DEFAULT_SAMPLING)

    def apply_preset(self, name: str) -> None:
        """Fill the fields with the preset ``name`` (its system prompt too)."""
        preset = self.store.presets.get(name)
        if preset is None:
            return
        self.system_prompt.setPlainText(preset.system_prompt or "")
        self._show(preset.sampling)
        self.preset.setCurrentText(name)
        self.delete_preset_button.setEnabled(True)

    # -- slots --

    def _on_preset_chosen(self, index: int) -> None:
        name = self.preset.itemText(index)
        if name == NO_PRESET:
            self.delete_preset_button.setEnabled(False)
        else:
            self.apply_preset(name)

    def _on_save_preset(self) -> None:
        name = self._ask_preset_name().strip()
        if not name or name == NO_PRESET:
            return
        presets = dict(self.store.presets)
        presets[name] = self.current_preset(name)
        self.store.presets = presets  # written through at once (AppSettings: to QSettings)
        self._fill_presets(name)

    def _on_delete_preset(self) -> None:
        name = self.preset.currentText()
        if name not in self.store.presets:
            return
        self.store.presets = {k: v for k, v in self.store.presets.items() if k != name}
        self._fill_presets(NO_PRESET)

    # -- the name box (tests replace it) --

    def _ask_preset_name(self) -> str:
        current = self.preset.currentText()
        name, ok = QInputDialog.getText(
            self,
            "Save as preset",
            "Preset name:",
            text="" if current == NO_PRESET else current,
        )
        return name if ok else ""

    # -- helpers --

    def _fill_presets(self, selected: str) -> None:
        self.preset.clear()
        self.preset.addItem(NO_PRESET)
        self.preset.addItems(sorted(self.store.presets))
        self.preset.setCurrentText(selected)
        self.delete_preset_button.setEnabled(selected in self.store.presets)

    def _boxes(self) -> tuple[QWidget, ...]:
        return (
            self.temperature,
            self.top_p,
            self.top_k,
            self.min_p,
            self.repetition_penalty,
            self.max_tokens,
            self.seed,
        )

    def _show(self, settings: dict) -> None:
        """Fill the boxes from ``settings``: a value out of its range is clamped into it, one
        that is no usable number (NaN, infinite, text: a chat imported or edited by hand
        before settings were checked) shows the default."""
        value = {
            **DEFAULT_SAMPLING,
            **{k: v for k, v in usable(settings).items() if v is not None or k == "seed"},
        }
        self.temperature.setValue(float(value["temperature"]))
        self.top_p.setValue(float(value["top_p"]))
        self.top_k.setValue(int(value["top_k"]))
        self.min_p.setValue(float(value["min_p"]))
        self.repetition_penalty.setValue(float(value["repetition_penalty"]))
        self.max_tokens.setValue(int(value["max_tokens"]))
        self.seed.setValue(self.seed.minimum() if value["seed"] is None else int(value["seed"]))


def _number(key: str, step: float, decimals: int) -> QDoubleSpinBox:
    """A box for the setting ``key``, over its range (``core.chats.settings.RANGES``)."""
    box = QDoubleSpinBox()
    box.setRange(RANGES[key].low, RANGES[key].high)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    return box
