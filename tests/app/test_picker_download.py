"""The picker's Download tab against the loopback hub: search, the fits badge, a download
with its progress bar, cancel, resume, load, delete."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QDialogButtonBox  # noqa: E402

from app.downloads import progress_text  # noqa: E402
from app.hub_panel import FIT_COLUMN  # noqa: E402
from app.model_picker import ModelPickerDialog  # noqa: E402
from core.models import usage  # noqa: E402
from core.models.hub import download, hf_cache
from tests.core.models.hub.hub_fixture import (  # noqa: E402
    BIG_MLX,
    GATED,
    MAMBA_GGUF,
    TINY_MLX,
    TWO_GGUF,
    free_port_url,
)

WEIGHTS = "model.safetensors"


@pytest.fixture
def picker(qtbot, tmp_path, loopback_hub):
    def open_(current: str | None = None) -> ModelPickerDialog:
        dialog = ModelPickerDialog(tmp_path / "data", current, on_cpu=True)
        qtbot.addWidget(dialog)
        dialog.show()
        qtbot.waitExposed(dialog)
        dialog.tabs.setCurrentIndex(1)
        return dialog

    (tmp_path / "data").mkdir()
    return open_


def _search(qtbot, dialog, text: str) -> dict[str, int]:
    panel = dialog.hub_panel
    panel.query.setText(text)
    qtbot.mouseClick(panel.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.search_button.isEnabled(), timeout=10_000)
    return {
        panel.results.topLevelItem(r).text(0): r for r in range(panel.results.topLevelItemCount())
    }


def _row(dialog, spec: str):
    tree = dialog.tree
    return next(
        tree.topLevelItem(r)
        for r in range(tree.topLevelItemCount())
        if tree.topLevelItem(r).data(0, Qt.ItemDataRole.UserRole) == spec
    )


def test_search_download_cancel_resume_load_delete(qtbot, picker, loopback_hub, tmp_path):
    dialog = picker()
    panel = dialog.hub_panel
    rows = _search(qtbot, dialog, "tiny")
    assert list(rows)[:3] == [TINY_MLX, BIG_MLX, "someone/tiny-chat-mlx"]
    big = panel.results.topLevelItem(rows[BIG_MLX])
    assert big.text(FIT_COLUMN) == "fits" and big.text(1) == "MLX"
    assert "KV pool" in big.toolTip(FIT_COLUMN)
    panel.results.setCurrentItem(big)
    assert panel.download_button.isEnabled() and panel.download_button.text() == "Download"

    # download, and cancel once the first 10 MB chunk is in
    progress = []

    def cancel_midway(p):
        progress.append((p, panel.progress.value(), panel.progress.format()))
        if p.file == WEIGHTS and 0 < p.done_bytes < p.total_bytes:
            qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)

    loopback_hub.rate = 50e6  # the cancel lands mid-file
    panel.progressed.connect(cancel_midway)
    qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)
    assert panel.cancel_button.isVisible() and not panel.download_button.isEnabled()
    qtbot.waitUntil(lambda: not panel.is_downloading(), timeout=20_000)
    assert "cancelled" in panel.status.text() and "pull it again to resume" in panel.status.text()
    assert progress and any(0 < value < 1000 for _, value, _ in progress)
    p, value, text = next(x for x in progress if 0 < x[1] < 1000)
    assert text.endswith(progress_text(p)) and "/s" in text and "left" in text
    assert hf_cache.resolve_repo(BIG_MLX) is None and BIG_MLX not in [
        _row_spec(dialog, r) for r in range(dialog.tree.topLevelItemCount())
    ]
    assert panel.download_button.text() == "Resume"
    panel.progressed.disconnect(cancel_midway)
    loopback_hub.rate = None

    # resume: only the missing bytes come, then the model is listed and selected
    loopback_hub.wait_idle()
    before = loopback_hub.served(BIG_MLX, WEIGHTS)
    partial = (
        hf_cache.repo_folder(BIG_MLX)
        / "blobs"
        / (loopback_hub.repos[BIG_MLX].files[WEIGHTS].etag + download.PARTIAL_SUFFIX)
    )
    kept = partial.stat().st_size
    with qtbot.waitSignal(panel.downloaded, timeout=20_000) as finished:
        qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)
    assert finished.args == [BIG_MLX]
    size = loopback_hub.repos[BIG_MLX].files[WEIGHTS].size
    assert loopback_hub.served(BIG_MLX, WEIGHTS) - before == size - kept
    assert dialog.tabs.currentIndex() == 0 and dialog.chosen_spec() == BIG_MLX
    assert (
        _row(dialog, BIG_MLX).text(4) == "never"
        and "Downloaded from the hub: 1" in dialog.disk_label.text()
    )

    # load: OK accepts it, and the loader takes the spec as it is
    with qtbot.waitSignal(dialog.accepted):
        qtbot.mouseClick(
            dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton
        )
    from core.models.load.loader import load_model

    info = load_model(dialog.chosen_spec(), dialog.data_root).info
    assert info.model_type == "llama"

    # delete (asks first), in a picker opened again: the row goes, the cache folder too
    again = picker()
    again.tabs.setCurrentIndex(0)
    again.tree.setCurrentItem(_row(again, BIG_MLX))
    assert _row(again, BIG_MLX).text(4) == "just now"  # the load above was recorded
    assert again.delete_button.isEnabled()
    asked = []
    again._confirm_delete = lambda spec, size: asked.append(spec) or False  # "No": nothing happens
    qtbot.mouseClick(again.delete_button, Qt.MouseButton.LeftButton)
    assert asked == [BIG_MLX] and hf_cache.resolve_repo(BIG_MLX) is not None
    again._confirm_delete = lambda spec, size: True
    qtbot.mouseClick(again.delete_button, Qt.MouseButton.LeftButton)
    assert not hf_cache.repo_folder(BIG_MLX).exists()
    assert BIG_MLX not in [_row_spec(again, r) for r in range(again.tree.topLevelItemCount())]
    assert usage.uses_under(again.data_root, hf_cache.repo_folder(BIG_MLX)) == []


def _row_spec(dialog, row: int) -> str:
    return dialog.tree.topLevelItem(row).data(0, Qt.ItemDataRole.UserRole)


def test_the_current_model_cannot_be_deleted(qtbot, picker):
    download.pull(TINY_MLX, data_root=None)
    dialog = picker(TINY_MLX)
    assert dialog.chosen_spec() == TINY_MLX and not dialog.delete_button.isEnabled()


def test_gguf_files_unsupported_families_and_errors(qtbot, picker, loopback_hub, monkeypatch):
    dialog = picker()
    panel = dialog.hub_panel
    rows = _search(qtbot, dialog, "gguf")
    mamba = panel.results.topLevelItem(rows[MAMBA_GGUF])
    assert mamba.text(FIT_COLUMN) == "can't load" and "can't map" in mamba.toolTip(0)
    panel.results.setCurrentItem(mamba)
    assert not panel.download_button.isEnabled()  # shown, not offered
    panel.results.setCurrentItem(panel.results.topLevelItem(rows[TWO_GGUF]))
    qtbot.waitUntil(lambda: panel.file_box.count() == 2, timeout=10_000)
    assert panel.file_box.itemText(0).startswith(
        "tiny-Q8_0.gguf"
    ) and "fits" in panel.file_box.itemText(0)
    assert panel.target() == f"{TWO_GGUF}:tiny-Q8_0.gguf" and panel.download_button.isEnabled()
    assert panel.status.text().startswith("2 GGUF files: tiny-Q8_0.gguf (the smallest that fits")

    monkeypatch.setenv("HF_ENDPOINT", free_port_url())  # offline: one line, and the window answers
    _search(qtbot, dialog, "qwen")
    assert panel.status.text().startswith("offline:") and "\n" not in panel.status.text()


def test_enter_in_the_search_box_searches_and_never_loads(qtbot, picker, loopback_hub):
    """Enter in the search box searched and also pressed OK, which loaded the other tab's
    model; now it only searches."""
    download.pull(TINY_MLX, data_root=None)
    dialog = picker(TINY_MLX)  # a model is selected on the other tab
    assert dialog.chosen_spec() == TINY_MLX
    panel = dialog.hub_panel
    panel.query.setFocus()
    qtbot.keyClicks(panel.query, "tiny")
    accepted = []
    dialog.accepted.connect(lambda: accepted.append(True))
    with qtbot.waitSignal(panel.results.model().rowsInserted, timeout=10_000):
        qtbot.keyClick(panel.query, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: panel.search_button.isEnabled(), timeout=10_000)
    names = [
        panel.results.topLevelItem(r).text(0) for r in range(panel.results.topLevelItemCount())
    ]
    assert TINY_MLX in names and panel.heading.text() == "Search results for “tiny”"
    assert not accepted and dialog.isVisible() and not panel.is_downloading()


def test_before_any_search_a_curated_list_with_fits_badges(qtbot, picker, loopback_hub):
    dialog = picker()
    panel = dialog.hub_panel
    rows = [
        [panel.results.topLevelItem(r).text(c) for c in range(7)]
        for r in range(panel.results.topLevelItemCount())
    ]
    assert 8 <= len(rows) <= 20 and loopback_hub.served("mlx-community/Qwen3-8B-4bit") == 0
    assert all(row[FIT_COLUMN] in ("fits", "tight", "won't fit") for row in rows)
    assert {row[1] for row in rows} == {"MLX", "GGUF"}
    assert "Good chat models to start with" in panel.heading.text()
    gguf = next(
        r
        for r in range(panel.results.topLevelItemCount())
        if panel.results.topLevelItem(r).text(1) == "GGUF"
    )
    item = panel.results.topLevelItem(gguf)
    panel.results.setCurrentItem(item)  # its file is in the list: no call to the hub
    assert panel.file_box.count() == 1 and panel.target().endswith(".gguf")
    assert "GB of memory" in item.toolTip(0) and "KV pool" in item.toolTip(FIT_COLUMN)


def test_a_gated_repo_shows_a_drawn_lock(qtbot, picker, loopback_hub):
    dialog = picker()
    panel = dialog.hub_panel
    rows = _search(qtbot, dialog, "gated")
    item = panel.results.topLevelItem(rows[GATED])
    assert item.text(0) == GATED  # no emoji, which is an empty box without an emoji font
    assert not item.icon(0).isNull() and "gated" in item.toolTip(0)
    image = item.icon(0).pixmap(16, 16).toImage()
    painted = sum(image.pixelColor(x, y).alpha() > 0 for x in range(16) for y in range(16))
    assert painted > 40  # a padlock, not a blank
