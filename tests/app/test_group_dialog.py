"""Serve settings for a group of Macs: the hostfile's hosts and whether the model splits
over them, a group started and stopped from the dialog, its state and faults shown. The
tests wait on the bridge's signals, never sleep."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

from app.group_bridge import GroupBridge  # noqa: E402
from app.group_dialog import GroupServeDialog  # noqa: E402
from core.distributed.group_server import GroupServer  # noqa: E402
from core.distributed.outcome import ENDED_PREFIX, fault_line  # noqa: E402
from core.models.tiny_model import TinyModelSpec, write_tiny_model  # noqa: E402

START_S = 180  # a real group: two processes importing MLX and loading, on a busy machine

# A stand-in for `radixchat serve --hosts` that prints what the real one prints: serving,
# then either a clean stop on Ctrl-C or a fault (the real group runs in the last test).
SERVING = (
    "radixchat: serving tiny split over 2 hosts at http://127.0.0.1:{port}/v1 (Ctrl-C to stop)"
)
FAULT = "rank 1 (macbook.local) left the group (connection closed)"
STAND_IN = """
import signal, sys
print({serving!r}, flush=True)
if {fault!r}:
    print({fault_line!r}, flush=True)
    print({ended!r}, flush=True)
    sys.exit(3)
signal.sigwait([signal.SIGINT])
print("radixchat: stopping", flush=True)
"""


class StandIn(GroupServer):
    def __init__(self, hostfile, model, port, data_dir, on_event, fault: bool = False):
        super().__init__(hostfile, model, port, data_dir, on_event)
        script = STAND_IN.format(
            serving=SERVING.format(port=port),
            fault=FAULT if fault else "",
            fault_line=fault_line(FAULT),
            ended=ENDED_PREFIX + FAULT,
        )
        self.command = [
            sys.executable,
            "-c",
            "import signal; signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])\n" + script,
        ]


def hostfile(tmp_path: Path, hosts=("127.0.0.1", "127.0.0.1")) -> Path:
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([{"ssh": h, "ips": ["127.0.0.1"]} for h in hosts]))
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return write_tiny_model(
        tmp_path_factory.mktemp("group-app") / "tiny-llama", TinyModelSpec(num_layers=2)
    )


def open_dialog(
    qtbot, tmp_path, model: Path, path: Path | None = None, factory=GroupServer, port: int = 8000
):
    bridge = GroupBridge(str(tmp_path / "data"), server_factory=factory)
    dialog = GroupServeDialog(bridge, model.name, str(model), port=port)
    qtbot.addWidget(dialog)
    dialog.show()
    if path is not None:
        with qtbot.waitSignal(bridge.checked, timeout=30000):
            dialog.hostfile.setText(str(path))
            dialog.check()
    return dialog, bridge


def test_a_hostfile_shows_its_hosts_and_whether_the_model_splits(qtbot, tmp_path, llama):
    dialog, bridge = open_dialog(
        qtbot, tmp_path, llama, hostfile(tmp_path, ("studio.local", "macbook.local"))
    )
    assert [dialog.hosts.item(i).text() for i in range(dialog.hosts.count())] == [
        "rank 0: studio.local (127.0.0.1)  — serves the API",
        "rank 1: macbook.local (127.0.0.1)",
    ]
    assert (
        dialog.split_label.text() == "✓ tiny-llama splits over 2 hosts: 1 of its 2 KV heads on each"
    )
    assert dialog.start_button.isEnabled() and not dialog.stop_button.isEnabled()

    odd = write_tiny_model(
        tmp_path / "odd", TinyModelSpec(num_layers=1, num_heads=3, num_kv_heads=3, hidden_size=48)
    )
    dialog.model_path = str(odd)
    with qtbot.waitSignal(bridge.checked, timeout=30000):
        dialog.check()
    assert dialog.split_label.text().startswith(
        "✗ odd cannot be split over 2 machines: its 3 attention heads"
    )
    assert not dialog.start_button.isEnabled()

    (tmp_path / "one.json").write_text(json.dumps([{"ssh": "studio.local", "ips": ["10.0.0.1"]}]))
    dialog._ask_file = lambda start: str(tmp_path / "one.json")  # the file dialog's answer
    with qtbot.waitSignal(bridge.checked, timeout=30000):
        dialog.browse_button.click()
    assert dialog.hosts.count() == 0 and "a group needs at least 2" in dialog.split_label.text()
    assert not dialog.start_button.isEnabled()


def test_start_and_stop_show_the_groups_state(qtbot, tmp_path, llama):
    dialog, bridge = open_dialog(
        qtbot, tmp_path, llama, hostfile(tmp_path), factory=StandIn, port=8123
    )
    with qtbot.waitSignal(bridge.serving, timeout=30000) as serving:
        dialog.start_button.click()
        assert (
            dialog.status_label.text() == "Starting on 2 hosts…" and not dialog.hostfile.isEnabled()
        )
    assert serving.args == ["http://127.0.0.1:8123/v1"]
    assert dialog.status_label.text() == "Serving at http://127.0.0.1:8123/v1 over 2 hosts"
    assert dialog.stop_button.isEnabled() and not dialog.start_button.isEnabled()
    dialog.close()  # the group runs on; the dialog opened again shows where it stands
    dialog = GroupServeDialog(bridge, llama.name, str(llama), str(hostfile(tmp_path)), port=8123)
    qtbot.addWidget(dialog)
    assert dialog.status_label.text() == "Serving at http://127.0.0.1:8123/v1"
    assert SERVING.format(port=8123) in dialog.log.toPlainText() and dialog.stop_button.isEnabled()
    with qtbot.waitSignal(bridge.ended, timeout=30000) as ended:
        dialog.stop_button.click()
        assert dialog.status_label.text() == "Stopping the group…"
    assert ended.args == [""]  # a clean stop
    assert dialog.status_label.text() == "Not running" and dialog.fault_label.isHidden()
    assert "radixchat: stopping" in dialog.log.toPlainText()
    assert dialog.start_button.isEnabled() and dialog.hostfile.isEnabled()


def test_a_fault_is_shown_plainly(qtbot, tmp_path, llama):
    def factory(*args):
        return StandIn(*args, fault=True)

    dialog, bridge = open_dialog(qtbot, tmp_path, llama, hostfile(tmp_path), factory=factory)
    with qtbot.waitSignals([bridge.fault, bridge.ended], timeout=30000):
        dialog.start_button.click()
    assert dialog.fault_label.isVisible()
    assert dialog.fault_label.text() == f"The group broke: {FAULT}"
    assert dialog.status_label.text() == "Not running" and dialog.start_button.isEnabled()


def test_a_group_that_cannot_start_says_why(qtbot, tmp_path, llama):
    dialog, bridge = open_dialog(qtbot, tmp_path, llama, hostfile(tmp_path))
    dialog.model_path = str(tmp_path / "gone")  # the model was moved after the check
    with qtbot.waitSignal(bridge.ended, timeout=120000) as ended:
        dialog.start_button.click()
    assert "gone" in ended.args[0] and dialog.fault_label.isVisible()
    assert dialog.fault_label.text().startswith("The group could not run: ")


def test_the_server_menu_opens_the_group_settings_for_the_loaded_model(
    qtbot, open_window, tmp_path
):
    from tests.app.window_fakes import FakeEngine, wait_ready

    window, bridge, _ = open_window(engine=FakeEngine(tmp_path))
    wait_ready(qtbot, bridge)
    assert window.group_action in window.menuBar().actions()[3].menu().actions()  # Server
    window.settings.group_hostfile = str(hostfile(tmp_path))  # the one a group last started with
    with qtbot.waitSignal(window.server.group_bridge.checked, timeout=30000):
        window.group_action.trigger()
    dialog = window.server.group_dialog
    assert dialog.isVisible() and dialog.model_label.text() == "fake-model"
    assert dialog.hosts.count() == 2
    # the fake model's path
    assert dialog.split_label.text().startswith("✗ /fake has no config.json")
    assert not dialog.start_button.isEnabled()
    window.group_action.trigger()  # a second time: the same dialog, raised
    assert window.server.group_dialog is dialog


@pytest.mark.distributed
def test_a_real_group_serves_and_its_killed_rank_is_named(qtbot, tmp_path, llama):
    from tests.core.distributed.group_fixture import Group, free_port, needs_ring

    if needs_ring.args[0]:
        pytest.skip(needs_ring.kwargs["reason"])

    def factory(hostfile_, model, port, data_dir, on_event):
        return GroupServer(
            hostfile_, model, port, data_dir, on_event, ("--ring-port", str(free_port(2)))
        )

    dialog, bridge = open_dialog(
        qtbot, tmp_path, llama, hostfile(tmp_path), factory=factory, port=free_port()
    )
    dialog.resize(760, 560)
    try:
        with qtbot.waitSignal(bridge.serving, timeout=START_S * 1000):
            dialog.start_button.click()
        assert dialog.status_label.text().startswith("Serving at http://127.0.0.1:")
        dialog.grab().save(str(tmp_path / "group-serving.png"))
        rank1 = Group(None, 0, None, tmp_path / "data").rank_pid(1)
        with qtbot.waitSignals([bridge.fault, bridge.ended], timeout=60000):
            os.kill(rank1, signal.SIGKILL)
        assert re.match(
            r"The group broke: rank 1 \(127\.0\.0\.1\) (left the group|was killed by SIGKILL)",
            dialog.fault_label.text(),
        ), dialog.fault_label.text()  # as in test_group.py
        assert dialog.status_label.text() == "Not running"
        # MLX's colours taken out
        assert "Node with rank 1 exited with code -9" in dialog.log.toPlainText()
        assert "\x1b" not in dialog.log.toPlainText()
        dialog.grab().save(str(tmp_path / "group-fault.png"))
    finally:
        bridge.shutdown(60)
