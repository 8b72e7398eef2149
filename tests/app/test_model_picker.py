"""The model picker: known models, local GGUF files and MLX folders, file dialogs (patched)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QDialog, QDialogButtonBox  # noqa: E402

from app.format import file_bytes, human_bytes  # noqa: E402
from app.model_picker import SPEC_ROLE, ModelPickerDialog  # noqa: E402
from core.models.catalog import safetensors_parameter_count  # noqa: E402
from core.models.pypi import provision  # noqa: E402
from core.models.tiny_model import TinyModelSpec, write_tiny_model  # noqa: E402
from tests.core.models.test_catalog import GGUF_PARAMETERS, write_gguf  # noqa: E402


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """A data folder with a GGUF file and a tiny MLX folder in models/, and an HF cache
    holding one MLX repo."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    root = tmp_path / "data"
    models = root / "models"
    models.mkdir(parents=True)
    write_gguf(models / "my-model.gguf")
    write_tiny_model(models / "tiny-llama", TinyModelSpec(num_layers=2))
    snapshots = tmp_path / "hf-cache" / "models--mlx-community--tiny-chat" / "snapshots"
    write_tiny_model(snapshots / "abc123", TinyModelSpec(num_layers=2))
    return root


@pytest.fixture
def open_picker(qtbot, data_root):
    def open_(current: str | None = None, on_cpu: bool = True) -> ModelPickerDialog:
        dialog = ModelPickerDialog(data_root, current, on_cpu=on_cpu)
        qtbot.addWidget(dialog)
        dialog.show()
        qtbot.waitExposed(dialog)
        return dialog

    return open_


def _rows(dialog: ModelPickerDialog) -> list[list[str]]:
    tree = dialog.tree
    return [
        [tree.topLevelItem(r).text(c) for c in range(tree.columnCount())]
        for r in range(tree.topLevelItemCount())
    ]


def _specs(dialog: ModelPickerDialog) -> list[str]:
    return [
        dialog.tree.topLevelItem(r).data(0, SPEC_ROLE)
        for r in range(dialog.tree.topLevelItemCount())
    ]


def _ok(dialog: ModelPickerDialog):
    return dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)


def test_lists_known_and_local_models(open_picker, data_root):
    dialog = open_picker("default")
    assert [dialog.tree.headerItem().text(c) for c in range(5)] == [
        "Name",
        "Kind",
        "Size",
        "Memory",
        "Last used",
    ]
    models = data_root / "models"
    known = list(provision.KNOWN_MODELS)
    assert _specs(dialog) == [
        *known,
        str(models / "my-model.gguf"),
        str(models / "tiny-llama"),
        "mlx-community/tiny-chat",
    ]
    rows = _rows(dialog)
    assert rows[0][0].endswith("(default)") and rows[0][1] == "GGUF · downloads on first use"
    assert rows[0][2] == "98.4 MB" and rows[0][3] == "513 MB"  # 135M weights as float32
    # the file's size as pip and the hub count it (10^6 bytes a MB), and the header says so
    assert "1,000,000 bytes" in dialog.tree.headerItem().toolTip(2)
    assert rows[len(known)][:2] == ["my-model", "GGUF · base: completion only"]  # no template
    assert rows[len(known) + 1][:2] == ["tiny-llama", "MLX folder"]
    assert rows[len(known) + 2][:2] == ["mlx-community/tiny-chat", "Hugging Face cache"]
    assert dialog.chosen_spec() == "default" and _ok(dialog).isEnabled()  # the current model


def test_memory_column_cpu_and_metal(open_picker, data_root):
    gguf_row = len(provision.KNOWN_MODELS)
    on_cpu = _rows(open_picker(on_cpu=True))
    assert on_cpu[gguf_row][3] == f"{4 * GGUF_PARAMETERS / 1024:.1f} KB"
    folder = data_root / "models" / "tiny-llama"
    parameters = safetensors_parameter_count(folder)
    assert on_cpu[gguf_row + 1][3] == human_bytes(4 * parameters)  # float32 already: about the file
    assert 4 * parameters <= (folder / "model.safetensors").stat().st_size <= 4.1 * parameters
    on_metal = _rows(open_picker(on_cpu=False))
    gguf = data_root / "models" / "my-model.gguf"  # weights stay as stored: memory = the file
    assert on_metal[gguf_row][3] == human_bytes(gguf.stat().st_size)
    assert on_metal[gguf_row][2] == file_bytes(gguf.stat().st_size)
    assert "float32" in open_picker(on_cpu=True).tree.headerItem().toolTip(3)


def test_nothing_preselected_without_a_current_model(qtbot, open_picker):
    dialog = open_picker()
    assert dialog.chosen_spec() is None and not _ok(dialog).isEnabled()
    with qtbot.waitSignal(dialog.accepted):
        item = dialog.tree.topLevelItem(1)
        rect = dialog.tree.visualItemRect(item)
        # a double click
        qtbot.mouseClick(dialog.tree.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
        qtbot.mouseDClick(dialog.tree.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert dialog.chosen_spec() == "gemma3-270m" and dialog.result() == QDialog.DialogCode.Accepted


def test_a_current_model_outside_the_list_gets_a_row(open_picker, tmp_path):
    elsewhere = write_gguf(tmp_path / "elsewhere.gguf")
    dialog = open_picker(str(elsewhere))
    assert _specs(dialog)[-1] == str(elsewhere) and dialog.chosen_spec() == str(elsewhere)
    missing = open_picker(str(tmp_path / "gone.gguf"))  # deleted since: nothing chosen, said why
    assert missing.chosen_spec() is None and missing.error_label.isVisible()


def test_open_gguf_file_chooses_it(qtbot, open_picker, tmp_path):
    (tmp_path / "downloads").mkdir()
    picked = write_gguf(tmp_path / "downloads" / "picked.gguf")
    dialog = open_picker("default")
    asked = []
    dialog._ask_gguf_path = lambda: asked.append(True) or ""  # cancelled: nothing changes
    qtbot.mouseClick(dialog.gguf_button, Qt.MouseButton.LeftButton)
    assert asked and dialog.chosen_spec() == "default"

    dialog._ask_gguf_path = lambda: str(picked)
    qtbot.mouseClick(dialog.gguf_button, Qt.MouseButton.LeftButton)
    assert dialog.chosen_spec() == str(picked)
    assert _rows(dialog)[-1][:2] == ["picked", "GGUF · base: completion only"]
    count = dialog.tree.topLevelItemCount()
    # the same file again: no second row
    qtbot.mouseClick(dialog.gguf_button, Qt.MouseButton.LeftButton)
    assert dialog.tree.topLevelItemCount() == count
    with qtbot.waitSignal(dialog.accepted):
        qtbot.mouseClick(_ok(dialog), Qt.MouseButton.LeftButton)
    assert dialog.chosen_spec() == str(picked)


def test_open_mlx_folder_chooses_it_or_says_why_not(qtbot, open_picker, data_root, tmp_path):
    dialog = open_picker("default")
    dialog._ask_mlx_folder = lambda: str(tmp_path)  # no config.json
    qtbot.mouseClick(dialog.folder_button, Qt.MouseButton.LeftButton)
    assert dialog.error_label.isVisible() and "not an MLX model folder" in dialog.error_label.text()
    assert dialog.chosen_spec() == "default"

    listed = str(data_root / "models" / "tiny-llama")
    dialog._ask_mlx_folder = lambda: listed  # already a row: selected, not added
    count = dialog.tree.topLevelItemCount()
    qtbot.mouseClick(dialog.folder_button, Qt.MouseButton.LeftButton)
    assert dialog.chosen_spec() == listed and dialog.tree.topLevelItemCount() == count
    assert not dialog.error_label.isVisible()

    other = write_tiny_model(tmp_path / "other-model", TinyModelSpec(num_layers=2))
    dialog._ask_mlx_folder = lambda: str(other)
    qtbot.mouseClick(dialog.folder_button, Qt.MouseButton.LeftButton)
    assert dialog.chosen_spec() == str(other) and _rows(dialog)[-1][:2] == [
        "other-model",
        "MLX folder",
    ]


@pytest.mark.real_model
def test_a_downloaded_default_model_says_so(qtbot, data_root_with_default):
    dialog = ModelPickerDialog(data_root_with_default, "default", on_cpu=True)
    qtbot.addWidget(dialog)
    assert _rows(dialog)[0][1:] == ["GGUF · downloaded", "98.4 MB", "513 MB", "never"]
    assert _specs(dialog).count("default") == 1


def test_the_widgets_do_not_import_mlx():
    code = (
        "import sys, app.model_picker, app.session_list, app.settings_dialogs; "
        "sys.exit(any(m.split('.')[0] == 'mlx' for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_files_made_from_a_model_show_beside_it_and_can_go(qtbot, data_root_with_default):
    """Loading the default model keeps its tokenizer (and a slow conversion its weights)
    in the data folder: the picker shows them beside the model and deletes them."""
    from core.models import derived
    from core.models.load.loader import load_model

    root = data_root_with_default
    load_model("default", root)
    made = derived.derived_files(root)
    assert len(made) == 1
    dialog = ModelPickerDialog(root, "default", on_cpu=True)
    qtbot.addWidget(dialog)
    row = _rows(dialog)[0]
    assert row[2] == f"98.4 MB + {file_bytes(made[0].size_bytes)}"
    tip = dialog.tree.topLevelItem(0).toolTip(2)
    assert tip.startswith("The model file, and files made from it at load and kept: tokenizer")
    assert f"Made from models: {file_bytes(made[0].size_bytes)}" in dialog.disk_label.text()
    assert dialog.clean_button.isEnabled()
    asked = []
    dialog._confirm_clean = lambda size: asked.append(size) or True
    qtbot.mouseClick(dialog.clean_button, Qt.MouseButton.LeftButton)
    assert asked == [made[0].size_bytes] and derived.derived_files(root) == []
    assert _rows(dialog)[0][2] == "98.4 MB" and not dialog.clean_button.isEnabled()
    assert "Deleted the files made from models" in dialog.hub_panel.status.text()


def test_base_models_say_so(open_picker):
    """gemma3-270m is a base model (its GGUF has no chat template): the picker says so
    before it is downloaded; the instruct models are not marked."""
    dialog = open_picker("default")
    rows = dict(zip(_specs(dialog), _rows(dialog), strict=True))
    assert rows["gemma3-270m"][1] == "GGUF · base: completion only · downloads on first use"
    item = dialog.tree.topLevelItem(_specs(dialog).index("gemma3-270m"))
    assert item.toolTip(1).startswith("A base model: it continues text rather than chatting")
    assert rows["default"][1] == rows["qwen2.5-coder-0.5b"][1] == "GGUF · downloads on first use"
    assert rows["mlx-community/tiny-chat"][1] == "Hugging Face cache"  # it has a template


def test_a_known_model_is_deleted_like_any_other(qtbot, open_picker, data_root, monkeypatch):
    """A known model downloaded into the data folder can be deleted from the picker (only the
    hub's could be); the loaded model cannot."""
    from core.models.pypi.known import KNOWN_MODELS
    from tests.core.models.pypi.test_provision import PAYLOAD, fake_model

    monkeypatch.setitem(KNOWN_MODELS, "tiny", fake_model())
    (data_root / "models" / "tiny.gguf").write_bytes(PAYLOAD)
    dialog = open_picker("tiny")
    assert dialog.chosen_spec() == "tiny" and not dialog.delete_button.isEnabled()  # loaded
    dialog = open_picker("default")
    dialog._select_spec("tiny")
    assert _rows(dialog)[_specs(dialog).index("tiny")][1] == "GGUF · downloaded"
    assert dialog.delete_button.isEnabled()
    asked = []
    dialog._confirm_delete = lambda spec, size: asked.append((spec, size)) or False
    qtbot.mouseClick(dialog.delete_button, Qt.MouseButton.LeftButton)
    assert asked == [("tiny", len(PAYLOAD))] and (data_root / "models" / "tiny.gguf").exists()
    dialog._confirm_delete = lambda spec, size: True
    qtbot.mouseClick(dialog.delete_button, Qt.MouseButton.LeftButton)
    assert not (data_root / "models" / "tiny.gguf").exists()
    assert _rows(dialog)[_specs(dialog).index("tiny")][1].endswith("downloads on first use")
    assert dialog.hub_panel.status.text().startswith("Deleted tiny: ")
    gguf = str(data_root / "models" / "my-model.gguf")  # a file of the data folder, too
    dialog._select_spec(gguf)
    qtbot.mouseClick(dialog.delete_button, Qt.MouseButton.LeftButton)
    assert gguf not in _specs(dialog) and not (data_root / "models" / "my-model.gguf").exists()


def test_last_used_is_filled_for_every_model_loaded(open_picker, data_root):
    """Issue 45.7: only the Hugging Face cache's models said when they were used last."""
    import time

    from core.models import usage

    models = data_root / "models"
    now = time.time()
    usage.record_use(data_root, models / "tiny-llama", str(models / "tiny-llama"), "f1", now - 7200)
    known = next(iter(provision.KNOWN_MODELS.values()))
    usage.record_use(data_root, models / known.filename, "default", "f2", now - 90)
    rows = dict(zip(_specs(open_picker("default")), _rows(open_picker("default")), strict=True))
    assert rows[str(models / "tiny-llama")][4] == "2 hours ago"
    assert rows["default"][4] == "1 minute ago"
    assert rows[str(models / "my-model.gguf")][4] == "never"
