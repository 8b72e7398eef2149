"""Chat Settings: top-k, min-p and repetition penalty reach the engine; named presets are
saved, applied, deleted and kept; a default for new chats."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSettings  # noqa: E402

from app.chat_settings import (  # noqa: E402
    DEFAULT_SAMPLING,
    MAX_SEED,
    NO_PRESET,
    ChatPreset,
    PresetStore,
    SessionSettingsDialog,
)
from app.settings_dialogs import AppSettings  # noqa: E402
from core.engine.types import SamplingParams  # noqa: E402
from tests.app.window_fakes import ScriptedEngine, send_turn, wait_ready  # noqa: E402


def _settings(tmp_path) -> AppSettings:
    return AppSettings(QSettings(str(tmp_path / "app.ini"), QSettings.Format.IniFormat))


def test_top_k_min_p_and_repetition_penalty_reach_the_engine(qtbot, open_window, tmp_path):
    engine = ScriptedEngine(tmp_path)
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    window.session_settings_action.trigger()
    dialog = window.settings_dialog
    dialog.top_k.setValue(40)
    dialog.min_p.setValue(0.05)
    dialog.repetition_penalty.setValue(1.15)
    with qtbot.waitSignal(dialog.accepted):
        dialog.accept()
    send_turn(qtbot, window, bridge, "one")
    sampling = engine.requests[-1].sampling
    assert (sampling.top_k, sampling.min_p, sampling.repetition_penalty) == (40, 0.05, 1.15)
    stored = store.get_session_by_id(window.session.id).settings
    assert (stored["top_k"], stored["min_p"], stored["repetition_penalty"]) == (40, 0.05, 1.15)

    window.session_settings_action.trigger()  # shown again as saved
    again = window.settings_dialog
    assert (again.top_k.value(), again.min_p.value(), again.repetition_penalty.value()) == (
        40,
        0.05,
        1.15,
    )
    again.reject()


def test_presets_are_saved_applied_deleted_and_kept(qtbot, tmp_path):
    settings = _settings(tmp_path)
    dialog = SessionSettingsDialog({"temperature": 0.7}, None, presets=settings)
    qtbot.addWidget(dialog)
    assert [dialog.preset.itemText(i) for i in range(dialog.preset.count())] == [NO_PRESET]
    dialog.system_prompt.setPlainText("Answer in one sentence.")
    dialog.temperature.setValue(0.2)
    dialog.repetition_penalty.setValue(1.1)
    dialog._ask_preset_name = lambda: "Terse"
    dialog.save_preset_button.click()
    assert dialog.preset.currentText() == "Terse" and dialog.delete_preset_button.isEnabled()

    # another chat's dialog, after a restart: the preset is there and fills the fields
    other = SessionSettingsDialog(
        {"temperature": 1.3, "seed": 5}, "Be chatty.", presets=_settings(tmp_path)
    )
    qtbot.addWidget(other)
    assert other.preset.findText("Terse") > 0
    other.preset.setCurrentIndex(other.preset.findText("Terse"))
    other.preset.activated.emit(other.preset.currentIndex())
    settings_shown, prompt = other.values()
    assert prompt == "Answer in one sentence."
    assert (settings_shown["temperature"], settings_shown["repetition_penalty"]) == (0.2, 1.1)
    assert settings_shown["seed"] is None  # the preset's, not the chat's
    SamplingParams(**settings_shown)

    other.delete_preset_button.click()
    assert other.preset.currentText() == NO_PRESET and other.preset.findText("Terse") < 0
    assert _settings(tmp_path).presets == {}


def test_hand_edited_presets_are_skipped(tmp_path):
    path = tmp_path / "app.ini"
    settings = QSettings(str(path), QSettings.Format.IniFormat)
    settings.setValue(
        "chat/presets", '[{"name": "ok", "sampling": {"top_k": 5, "bad": 1}}, 7, {"x": 1}]'
    )
    settings.sync()
    presets = AppSettings(QSettings(str(path), QSettings.Format.IniFormat)).presets
    assert presets == {"ok": ChatPreset("ok", None, {"top_k": 5})}


def test_new_chats_start_with_the_default_set_in_chat_settings(qtbot, open_window, tmp_path):
    engine = ScriptedEngine(tmp_path)
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    window.session_settings_action.trigger()
    dialog = window.settings_dialog
    dialog.system_prompt.setPlainText("You are a pirate.")
    dialog.repetition_penalty.setValue(1.1)
    dialog.for_new_chats.setChecked(True)
    with qtbot.waitSignal(dialog.accepted):
        dialog.accept()
    send_turn(qtbot, window, bridge, "one")
    header = window.chat_header.text()  # issue 45.5: the chat's settings where people look
    assert "System prompt: “You are a pirate.”" in header and "the new-chat default" in header

    # this chat's own settings change afterwards: new chats keep the default
    store.update_session(window.session.id, settings={"temperature": 1.9}, system_prompt="x")
    window.session = store.get_session_by_id(window.session.id)
    window.new_action.trigger()
    fresh = store.get_session_by_id(window.session.id)
    assert fresh.system_prompt == "You are a pirate."
    assert fresh.settings["repetition_penalty"] == 1.1 and fresh.settings["temperature"] == 0.7
    assert "“You are a pirate.”" in window.chat_header.text()
    send_turn(qtbot, window, bridge, "two")
    request = engine.requests[-1]
    assert request.messages[0].content == "You are a pirate."
    assert request.sampling.repetition_penalty == 1.1
    # issue 45.7: its dialog tells the truth: these are the new-chat default's settings
    window.session_settings_action.trigger()
    dialog = window.settings_dialog
    assert dialog.for_new_chats.isChecked() and dialog.preset.currentText() == NO_PRESET
    dialog.reject()


def test_the_dialog_opens_on_the_preset_the_chat_uses(qtbot):
    presets = PresetStore()
    presets.presets = {
        "Brief": ChatPreset("Brief", "Be brief.", {"temperature": 0.2, "max_tokens": 128}),
        "Pirate": ChatPreset("Pirate", "Arr.", {}),
    }
    presets.new_chat_defaults = ChatPreset("new chats", "Be brief.", {"temperature": 0.2})
    brief = {**DEFAULT_SAMPLING, "temperature": 0.2, "max_tokens": 128}
    dialog = SessionSettingsDialog(brief, "Be brief.", presets=presets)
    qtbot.addWidget(dialog)
    assert dialog.preset.currentText() == "Brief" and dialog.delete_preset_button.isEnabled()
    assert not dialog.for_new_chats.isChecked()  # the default's max tokens differ
    default = SessionSettingsDialog(
        {**DEFAULT_SAMPLING, "temperature": 0.2}, "Be brief.", presets=presets
    )
    qtbot.addWidget(default)
    assert default.for_new_chats.isChecked() and default.preset.currentText() == NO_PRESET
    other = SessionSettingsDialog(
        {**DEFAULT_SAMPLING, "temperature": 0.3}, "Be brief.", presets=presets
    )
    qtbot.addWidget(other)
    assert other.preset.currentText() == NO_PRESET and not other.for_new_chats.isChecked()


BAD_STORED = {
    "temperature": float("nan"),
    "max_tokens": float("inf"),
    "top_k": "5",
    "top_p": 9,
    "seed": 1e30,
}


def test_the_dialog_opens_on_bad_stored_values(qtbot):
    """Settings stored before imports were checked (issue 42.4: NaN, Infinity, "5"): the
    dialog opens (on main: OverflowError) with the default where a value is unusable and
    the range's end where it is out of range, and gives back settings the engine takes."""
    dialog = SessionSettingsDialog(BAD_STORED, None)
    qtbot.addWidget(dialog)
    shown, _ = dialog.values()
    assert shown["temperature"] == DEFAULT_SAMPLING["temperature"]
    assert shown["max_tokens"] == DEFAULT_SAMPLING["max_tokens"]
    assert shown["top_k"] == DEFAULT_SAMPLING["top_k"]
    assert shown["top_p"] == 1.0 and shown["seed"] == MAX_SEED
    SamplingParams(**{k: v for k, v in shown.items() if k in DEFAULT_SAMPLING})


def test_bad_stored_values_never_reach_the_engine(qtbot, open_window, tmp_path):
    engine = ScriptedEngine(tmp_path)
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    send_turn(qtbot, window, bridge, "one")
    store.update_session(window.session.id, settings=BAD_STORED)
    window.session = store.get_session_by_id(window.session.id)
    send_turn(qtbot, window, bridge, "two")
    sampling = engine.requests[-1].sampling
    assert sampling.temperature == DEFAULT_SAMPLING["temperature"]
    assert (sampling.max_tokens, sampling.top_k) == (
        DEFAULT_SAMPLING["max_tokens"],
        DEFAULT_SAMPLING["top_k"],
    )
    assert (sampling.top_p, sampling.seed) == (1.0, MAX_SEED)
