"""Downloads run in the background: the picker closes, the download goes on (the status bar
shows it), the user keeps chatting, and the downloads list cancels, resumes and loads it.
Against the loopback hub; every step waits on a signal."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402

from app.downloads import DONE, RUNNING, STOPPED  # noqa: E402
from core.models.hub import hf_cache  # noqa: E402
from tests.app.window_fakes import WAIT_MS, ScriptedEngine, send_turn, wait_ready  # noqa: E402
from tests.core.models.hub.hub_fixture import BIG_MLX  # noqa: E402

WEIGHTS = "model.safetensors"


def _partway(p) -> bool:
    return p.file == WEIGHTS and 0 < p.done_bytes < p.total_bytes


def test_a_download_goes_on_after_the_picker_closes(qtbot, open_window, tmp_path, loopback_hub):
    window, bridge, store = open_window(engine=ScriptedEngine(tmp_path))
    wait_ready(qtbot, bridge)
    assert not window.downloads_status.isVisible()
    window.model_action.trigger()
    picker = window.model_dialog
    picker.tabs.setCurrentIndex(1)
    panel = picker.hub_panel
    panel.query.setText("wide")
    with qtbot.waitSignal(panel.results.model().rowsInserted, timeout=WAIT_MS):
        panel.search()
    row = next(
        r
        for r in range(panel.results.topLevelItemCount())
        if panel.results.topLevelItem(r).text(0) == BIG_MLX
    )
    panel.results.setCurrentItem(panel.results.topLevelItem(row))
    loopback_hub.rate = 2e6  # about 14 s for its 27 MB: it is still running when checked
    manager = window.downloads
    with qtbot.waitSignal(
        manager.progressed, timeout=WAIT_MS, check_params_cb=lambda t, p: _partway(p)
    ):
        qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)
    picker.reject()  # closing the picker no longer cancels it
    assert manager.get(BIG_MLX).state == RUNNING
    with qtbot.waitSignal(manager.progressed, timeout=WAIT_MS):
        pass
    assert window.downloads_status.isVisible()
    assert window.downloads_status.button.text().startswith("Downloading Tiny-Llama-Wide: ")
    reply, _ = send_turn(qtbot, window, bridge, "still chatting?")  # the chat goes on
    assert reply == "reply 1"

    # the downloads list: cancel keeps the bytes, resume finishes it, load loads it
    window.downloads_action.trigger()
    listing = window.downloads_dialog
    assert listing.isVisible() and listing.selected() == BIG_MLX
    assert listing.cancel_button.isEnabled() and not listing.load_button.isEnabled()
    with qtbot.waitSignal(manager.failed, timeout=WAIT_MS) as stopped:
        qtbot.mouseClick(listing.cancel_button, Qt.MouseButton.LeftButton)
    assert "cancelled" in stopped.args[1] and manager.get(BIG_MLX).state == STOPPED
    assert listing.row_texts()[0][1].startswith("download of")
    assert listing.resume_button.isEnabled() and not window.downloads_status.isVisible()
    assert hf_cache.resolve_repo(BIG_MLX) is None

    loopback_hub.rate = None
    with qtbot.waitSignal(manager.finished, timeout=WAIT_MS) as finished:
        qtbot.mouseClick(listing.resume_button, Qt.MouseButton.LeftButton)
    assert finished.args == [BIG_MLX, BIG_MLX] and manager.get(BIG_MLX).state == DONE
    assert listing.row_texts() == [(BIG_MLX, "downloaded")]
    assert f"{BIG_MLX} is downloaded" in window.state_label.text()
    assert hf_cache.resolve_repo(BIG_MLX) is not None
    with qtbot.waitSignal(bridge.modelReady, timeout=WAIT_MS) as ready:
        qtbot.mouseClick(listing.load_button, Qt.MouseButton.LeftButton)
    assert ready.args == [BIG_MLX] and window.model_label.text() == BIG_MLX


def test_the_window_closing_stops_downloads_and_keeps_their_bytes(
    qtbot, open_window, tmp_path, loopback_hub
):
    window, bridge, store = open_window(engine=ScriptedEngine(tmp_path))
    manager = window.downloads
    loopback_hub.rate = 2e6  # still running when the window closes
    with qtbot.waitSignal(
        manager.progressed, timeout=WAIT_MS, check_params_cb=lambda t, p: _partway(p)
    ):
        manager.start(BIG_MLX)
    with qtbot.waitSignal(manager.failed, timeout=WAIT_MS):
        window.close()
    open_window.close(window, bridge, store)

    window, bridge, store = open_window(engine=ScriptedEngine(tmp_path))  # the next start
    window.downloads_action.trigger()
    rows = window.downloads_dialog.row_texts()
    assert rows[0][0] == BIG_MLX and rows[0][1].endswith("kept: resume it")
    assert window.downloads_dialog.resume_button.isEnabled()
