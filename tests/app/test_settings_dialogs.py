"""A chat's settings dialog, the app's settings in QSettings, and the app settings dialog."""

from __future__ import annotations

import os
from dataclasses import replace

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtCore import QSettings, Qt  # noqa: E402
from PySide6.QtWidgets import QDialogButtonBox, QLabel  # noqa: E402

from app.chat_settings import DEFAULT_SAMPLING, SessionSettingsDialog  # noqa: E402
from app.settings_dialogs import AppSettings, AppSettingsDialog  # noqa: E402
from core.engine.config import EngineConfig  # noqa: E402
from core.engine.types import SamplingParams  # noqa: E402


def _session_dialog(qtbot, settings: dict, prompt: str | None) -> SessionSettingsDialog:
    dialog = SessionSettingsDialog(settings, prompt)
    qtbot.addWidget(dialog)
    return dialog


def test_session_settings_round_trip(qtbot):
    settings = {"temperature": 0.3, "top_p": 0.9, "max_tokens": 1024, "seed": 42, "stop": ["###"]}
    dialog = _session_dialog(qtbot, settings, "Answer in one sentence.")
    assert dialog.system_prompt.toPlainText() == "Answer in one sentence."
    added = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}  # the engine's defaults
    assert dialog.values() == ({**settings, **added}, "Answer in one sentence.")  # others kept


def test_session_settings_defaults_and_random_seed(qtbot):
    dialog = _session_dialog(qtbot, {}, None)
    assert dialog.values() == (DEFAULT_SAMPLING, None)
    assert dialog.seed.text() == "random"
    assert DEFAULT_SAMPLING == {
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "max_tokens": 512,
        "seed": None,
    }
    assert (dialog.top_k.text(), dialog.min_p.text(), dialog.repetition_penalty.text()) == (
        "off",
        "off",
        "off",
    )
    SamplingParams(**DEFAULT_SAMPLING)  # what the engine accepts

    dialog.seed.setValue(0)
    assert dialog.values()[0]["seed"] == 0  # 0 is a seed, not "random"
    dialog.seed.setValue(dialog.seed.minimum())
    assert dialog.values()[0]["seed"] is None and dialog.seed.text() == "random"


def test_session_settings_edits_and_limits(qtbot):
    dialog = _session_dialog(qtbot, {"temperature": 0.7, "seed": None}, "old prompt")
    dialog.system_prompt.setPlainText("   \n")  # blank: no system prompt
    dialog.temperature.setValue(5.0)
    dialog.top_p.setValue(0.0)
    dialog.max_tokens.setValue(10**6)
    dialog.seed.selectAll()  # as tabbing into the box does
    qtbot.keyClicks(dialog.seed, "7")
    settings, prompt = dialog.values()
    assert prompt is None
    assert settings == {
        "temperature": 2.0,
        "top_p": 0.01,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "max_tokens": 32768,
        "seed": 7,
    }
    SamplingParams(**settings)

    dialog.buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).click()
    assert dialog.values()[0] == DEFAULT_SAMPLING
    dialog.temperature.setValue(0.0)
    with qtbot.waitSignal(dialog.accepted):
        qtbot.mouseClick(
            dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton
        )
    assert dialog.values()[0]["temperature"] == 0.0


@pytest.fixture
def ini(tmp_path):
    """A fresh QSettings on an ini file for each call, all on the same file."""
    path = str(tmp_path / "radixchat.ini")
    return lambda: QSettings(path, QSettings.Format.IniFormat)


def test_app_settings_start_empty_and_persist(ini):
    first = AppSettings(ini())
    assert (first.data_dir, first.kv_pool_mb, first.disk_cache_gb, first.last_model) == (None,) * 4
    assert (first.window_geometry, first.window_state, first.splitter_state) == (None,) * 3
    first.data_dir = "/data/My, Models"  # a comma: still one string
    first.kv_pool_mb = 2048
    first.disk_cache_gb = 2.5
    first.last_model = "mlx-community/Qwen3-0.6B-4bit"
    first.window_geometry = b"\x01\xd9\xd0\xcb\x00geometry"
    first.window_state = b"\x00\xff state"
    first.splitter_state = b"\x00\x00split"
    first.sync()

    second = AppSettings(ini())
    assert second.data_dir == "/data/My, Models"
    assert second.kv_pool_mb == 2048 and isinstance(second.kv_pool_mb, int)
    assert second.disk_cache_gb == 2.5
    assert second.last_model == "mlx-community/Qwen3-0.6B-4bit"
    assert second.window_geometry == b"\x01\xd9\xd0\xcb\x00geometry"
    assert second.window_state == b"\x00\xff state" and second.splitter_state == b"\x00\x00split"

    second.kv_pool_mb = None  # back to automatic: the key goes
    second.data_dir = ""
    second.sync()
    third = AppSettings(ini())
    assert third.kv_pool_mb is None and third.data_dir is None
    assert not third.qsettings.contains("kv_pool_mb")


def test_app_settings_ignore_nonsense(tmp_path):
    path = tmp_path / "radixchat.ini"
    path.write_text("[General]\nkv_pool_mb=lots\ndisk_cache_gb=\n")
    settings = AppSettings(QSettings(str(path), QSettings.Format.IniFormat))
    assert settings.kv_pool_mb is None and settings.disk_cache_gb is None


def _app_dialog(qtbot, settings: AppSettings) -> AppSettingsDialog:
    dialog = AppSettingsDialog(
        settings, default_data_dir="/home/me/.local/share/RadixChat", default_disk_cache_gb=10
    )
    qtbot.addWidget(dialog)
    return dialog


def test_app_settings_dialog_shows_defaults(qtbot, ini):
    dialog = _app_dialog(qtbot, AppSettings(ini()))
    assert dialog.data_dir.text() == ""
    assert "/home/me/.local/share/RadixChat" in dialog.data_dir.placeholderText()
    assert dialog.kv_pool_mb.text() == "Automatic"
    assert dialog.disk_cache_gb.text() == "Default (10 GB)"
    dialog.apply()
    settings = AppSettings(ini())
    assert (settings.data_dir, settings.kv_pool_mb, settings.disk_cache_gb) == (None, None, None)


def test_app_settings_dialog_writes_on_ok_only(qtbot, ini, tmp_path):
    settings = AppSettings(ini())
    settings.kv_pool_mb = 1024
    dialog = _app_dialog(qtbot, settings)
    assert dialog.kv_pool_mb.value() == 1024
    chosen = str(tmp_path / "elsewhere")
    dialog._ask_directory = lambda start: chosen
    qtbot.mouseClick(dialog.browse_button, Qt.MouseButton.LeftButton)
    assert dialog.data_dir.text() == chosen
    dialog.kv_pool_mb.setValue(0)
    dialog.disk_cache_gb.setValue(25)
    dialog.reject()
    assert AppSettings(ini()).data_dir is None and AppSettings(ini()).kv_pool_mb == 1024

    dialog = _app_dialog(qtbot, settings)
    dialog._ask_directory = lambda start: ""  # the folder dialog was cancelled
    qtbot.mouseClick(dialog.browse_button, Qt.MouseButton.LeftButton)
    assert dialog.data_dir.text() == ""
    dialog.data_dir.setText(chosen)
    dialog.kv_pool_mb.setValue(0)
    dialog.disk_cache_gb.setValue(25)
    with qtbot.waitSignal(dialog.accepted):
        dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    saved = AppSettings(ini())
    assert (saved.data_dir, saved.kv_pool_mb, saved.disk_cache_gb) == (chosen, None, 25.0)


def test_app_sampling_defaults_are_the_engines(qtbot):
    """The window's and the dialog's defaults are SamplingParams' own, field for field."""
    from app import main_window

    assert main_window.DEFAULT_SAMPLING is DEFAULT_SAMPLING
    assert SamplingParams(**DEFAULT_SAMPLING) == SamplingParams()
    dialog = _session_dialog(
        qtbot, {"temperature": 1.5, "top_p": 0.5, "max_tokens": 7, "seed": 3}, None
    )
    dialog.restore_defaults()
    assert SamplingParams(**dialog.values()[0]) == SamplingParams()


def test_disk_budget_typed_is_the_budget_the_engine_gets(qtbot, ini, tmp_path, tiny_model):
    """Typed "2.5" GB in Preferences: the engine's budget is 2.5 * 2**30 bytes, the memory panel
    shows "of 2.5 GB" and the dialog's default reads in the same unit."""
    from app.memory_panel import MemoryPanel
    from core.engine.engine import Engine
    from core.paths import GB, RESPONSES_FILE_FACTOR, stored_responses_budget

    dialog = _app_dialog(qtbot, AppSettings(ini()))
    dialog.disk_cache_gb.selectAll()
    qtbot.keyClicks(dialog.disk_cache_gb, "2.5")
    qtbot.mouseClick(
        dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok),
        Qt.MouseButton.LeftButton,
    )
    config = AppSettings(ini()).engine_config()
    assert config == EngineConfig(disk_budget_bytes=int(2.5 * 2**30))

    engine = Engine(tmp_path / "data", str(tiny_model), config=config).start()
    try:
        engine.wait_ready(timeout=60)
        stats = engine.stats()
    finally:
        engine.shutdown()
    # the KV cache's part of the folder's 2.5 GB: less the stored responses' share (256 MB)
    responses = RESPONSES_FILE_FACTOR * stored_responses_budget(int(2.5 * GB))
    kv_budget = int(2.5 * GB) - responses
    assert stats.disk_cache_budget_bytes == kv_budget == 2 * GB  # the share at most 256 MB
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    panel.update_stats(stats)
    assert panel.findChild(QLabel, "diskCacheValue").text().split(" · ")[0].endswith("of 2.0 GB")

    from kvcache.store import DEFAULT_BUDGET  # the test may look inside; the app may not

    shown = AppSettingsDialog(AppSettings(ini()), default_data_dir="/tmp")
    qtbot.addWidget(shown)
    assert shown.disk_cache_gb.specialValueText() == f"Default ({DEFAULT_BUDGET / 2**30:g} GB)"


def test_kv_precision_chosen_in_preferences_is_the_engines_kv_format(qtbot, ini, tmp_path):
    """Preferences → KV precision 4-bit, groups of 32: the engine gets those plain numbers,
    stores full-attention K/V so, and says so per layer kind."""
    from core.engine.engine import Engine
    from core.models.tiny_model import TinyModelSpec, write_tiny_model

    dialog = _app_dialog(qtbot, AppSettings(ini()))
    assert dialog.kv_precision.currentText().startswith("Full")
    assert not dialog.kv_group_size.isEnabled()  # it applies to a quantized format only
    dialog.kv_precision.setCurrentIndex(dialog.kv_precision.findData(4))
    assert dialog.kv_group_size.isEnabled()
    dialog.kv_group_size.setCurrentIndex(dialog.kv_group_size.findData(32))
    assert dialog.apply() == ["the KV precision"]
    config = AppSettings(ini()).engine_config()
    assert config == EngineConfig(kv_bits=4, kv_group_size=32)

    model = write_tiny_model(tmp_path / "m", TinyModelSpec(hidden_size=128))  # head dim 32
    engine = Engine(tmp_path / "data", str(model), config=replace(config, pool_tokens=256))
    engine.start()
    try:
        engine.wait_ready(timeout=60)
        cache = engine.stats().cache
    finally:
        engine.shutdown()
    assert dict(cache.kv_formats) == {"full": "4-bit (group 32)"}

    again = _app_dialog(qtbot, AppSettings(ini()))  # shown as saved; back to full precision
    assert again.kv_precision.currentData() == 4 and again.kv_group_size.currentData() == 32
    again.kv_precision.setCurrentIndex(0)
    assert again.apply() == ["the KV precision"]
    assert AppSettings(ini()).engine_config() == EngineConfig()


def test_the_command_lines_kv_format_goes_over_the_preferences(ini):
    """``radixchat --kv-bits 8``: the Preferences' pool and disk budget stay, their KV
    precision gives way (their group size too where the command line names one)."""
    settings = AppSettings(ini())
    settings.kv_bits, settings.kv_group_size, settings.kv_pool_mb = 4, 32, 512
    assert settings.engine_config(kv_bits=8) == EngineConfig(
        kv_bits=8, kv_group_size=32, pool_bytes=512 * 2**20
    )
    assert settings.engine_config(kv_bits=8, kv_group_size=128).kv_group_size == 128
    assert settings.engine_config().kv_bits == 4
    settings.kv_bits = None  # a group size alone means nothing in the Preferences
    assert settings.engine_config().kv_format.quantized is False
    assert settings.engine_config(kv_bits=8).kv_group_size is None
