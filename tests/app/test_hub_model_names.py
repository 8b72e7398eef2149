"""A model from the hub is called by its org/name in the toolbar, the status bar and the
API's /v1/models (its snapshot folder, a commit id, was shown)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import urllib.request  # noqa: E402

from core.models.hub import download  # noqa: E402
from tests.app.window_fakes import WAIT_MS, wait_ready  # noqa: E402
from tests.core.models.hub.hub_fixture import TINY_MLX  # noqa: E402


def test_a_hub_model_shows_as_org_name(qtbot, open_window, loopback_hub):
    pulled = download.pull(TINY_MLX, data_root=None)
    assert pulled.path.name != "Tiny-Llama-128"  # a commit id
    window, bridge, _ = open_window(spec=TINY_MLX)
    name = wait_ready(qtbot, bridge)
    assert name == TINY_MLX
    assert window.model_label.text() == TINY_MLX
    assert window.model_button.text() == f"Model: {TINY_MLX}"
    assert window.memory_panel.model_label.text().startswith(TINY_MLX)  # after the next poll
    window.serve_action.trigger()
    with urllib.request.urlopen(bridge.server_address + "/v1/models", timeout=30) as response:
        assert [m["id"] for m in json.load(response)["data"]] == [TINY_MLX]
    with qtbot.waitSignal(bridge.serverStopped, timeout=WAIT_MS):
        window.serve_action.trigger()
