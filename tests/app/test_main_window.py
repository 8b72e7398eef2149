"""The plain main window and its engine bridge: a real engine on a tiny model, and fakes."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import urllib.request  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402

from app.bridge import EngineBridge  # noqa: E402
from app.main_window import MainWindow  # noqa: E402
from core.chat_store import ChatStore  # noqa: E402
from core.engine import Engine, RequestHandle  # noqa: E402
from core.engine_types import ErrorEvent, GenerationRequest, TokenEvent  # noqa: E402
from core.errors import UserError  # noqa: E402
from core.model_loader import ModelInfo  # noqa: E402
from core.paths import chats_db_path  # noqa: E402

WAIT_MS = 30000


class FakeEngine(Engine):
    """The real interface without a thread: a scripted load result and scripted replies."""

    def __init__(self, data_root, load_error: str | None = None, events: tuple = ()):
        super().__init__(data_root, model_spec=None)
        self.load_error, self.events = load_error, events
        self.requests: list[GenerationRequest] = []

    def start(self) -> Engine:
        return self

    def wait_ready(self, timeout: float | None = None) -> ModelInfo:
        if self.load_error is not None:
            raise UserError(self.load_error)
        return ModelInfo(spec="fake", name="fake-model", path="/fake", model_type="llama",
                         fingerprint="0" * 16, weights_format="float32", weight_bytes=0,
                         context_length=512, num_layers=1, load_seconds=0.0)

    def submit(self, request: GenerationRequest) -> RequestHandle:
        self.requests.append(request)
        handle = RequestHandle(request)
        for event in self.events:
            handle._emit(event)
        handle._finish()
        return handle


@pytest.fixture
def open_window(qtbot, tmp_path):
    """open_window(spec=..., engine=..., server_port=...) -> (window, bridge, store), shut down
    afterwards. "Serve API" listens on any free port unless told otherwise."""
    opened = []

    def open_(spec: str | None = None, engine: Engine | None = None, server_port: int = 0):
        bridge = EngineBridge(tmp_path, spec, engine=engine)
        store = ChatStore(chats_db_path(tmp_path))
        window = MainWindow(bridge, store, server_port=server_port)
        qtbot.addWidget(window)
        window.show()
        opened.append((bridge, store))
        return window, bridge, store

    yield open_
    for bridge, store in opened:
        bridge.shutdown()
        store.close()


def _ready(qtbot, bridge: EngineBridge) -> str:
    with qtbot.waitSignal(bridge.modelReady, timeout=WAIT_MS) as ready:
        bridge.start()
    return ready.args[0]


def test_a_turn_streams_into_the_transcript_and_is_stored(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    assert not window.input.isEnabled()  # the window is up before the model
    progress = []
    bridge.loadProgress.connect(lambda stage, fraction: progress.append((stage, fraction)))
    name = _ready(qtbot, bridge)
    assert progress and all(stage and (fraction == -1.0 or 0 <= fraction <= 1) for stage, fraction in progress)
    assert window.input.isEnabled()
    assert name in window.statusBar().currentMessage()

    window.sampling = {"temperature": 0.0, "max_tokens": 24}
    tokens = []
    bridge.token.connect(tokens.append)
    qtbot.keyClicks(window.input, "Hello there")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        qtbot.keyClick(window.input, Qt.Key.Key_Return)
    reply, stats = done.args

    assert reply and "".join(tokens) == reply
    transcript = window.transcript.toPlainText()
    assert "You:\nHello there" in transcript
    assert transcript.endswith("Assistant:\n" + reply)
    assert stats["completion_tokens"] > 0 and stats["finish_reason"] in ("stop", "length")
    assert "tok/s" in window.statusBar().currentMessage()
    assert window.input.isEnabled() and window.input.toPlainText() == ""
    stored = store.messages(window.session.id)
    assert [(m.role, m.content) for m in stored] == [("user", "Hello there"), ("assistant", reply)]
    assert stored[1].stats == stats
    assert window.messages == [("user", "Hello there"), ("assistant", reply)]


def test_stop_ends_the_reply_early(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    _ready(qtbot, bridge)
    window.sampling = {"temperature": 0.0, "max_tokens": 400}
    qtbot.keyClicks(window.input, "Tell me a long story")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
            qtbot.keyClick(window.input, Qt.Key.Key_Return)
        assert window.stop_button.isEnabled() and not window.send_button.isEnabled()
        qtbot.mouseClick(window.stop_button, Qt.MouseButton.LeftButton)
    reply, stats = done.args
    assert stats["finish_reason"] == "cancelled"
    assert stats["completion_tokens"] < 400
    assert "stopped" in window.statusBar().currentMessage()
    assert not window.stop_button.isEnabled() and window.input.isEnabled()
    assert store.messages(window.session.id)[-1].content == reply


def test_load_failure_shows_the_error(qtbot, open_window, tmp_path):
    window, bridge, _ = open_window(engine=FakeEngine(tmp_path, load_error="no model at /nope"))
    with qtbot.waitSignal(bridge.loadFailed, timeout=WAIT_MS) as failed:
        bridge.start()
    assert failed.args == ["no model at /nope"]
    assert "no model at /nope" in window.statusBar().currentMessage()
    assert window.error_box is not None and window.error_box.isVisible()
    assert "no model at /nope" in window.error_box.informativeText()
    assert not window.input.isEnabled() and not window.send_button.isEnabled()
    window.error_box.close()


def test_an_error_mid_reply_reenables_the_input(qtbot, open_window, tmp_path):
    engine = FakeEngine(tmp_path, events=(TokenEvent("Hel"), ErrorEvent("the engine broke")))
    window, bridge, store = open_window(engine=engine)
    assert _ready(qtbot, bridge) == "fake-model"

    qtbot.keyClicks(window.input, "first line")
    qtbot.keyClick(window.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(window.input, "second line")
    assert window.input.toPlainText() == "first line\nsecond line"  # Shift+Enter did not send
    with qtbot.waitSignal(bridge.failed, timeout=WAIT_MS) as failed:
        qtbot.keyClick(window.input, Qt.Key.Key_Enter)
    assert failed.args == ["the engine broke"]
    assert [(m.role, m.content) for m in engine.requests[0].messages] == [("user", "first line\nsecond line")]
    assert window.input.isEnabled() and window.send_button.isEnabled()
    assert not window.stop_button.isEnabled()
    assert window.input.toPlainText() == "first line\nsecond line"  # given back to send again
    assert "Assistant:\nHel" in window.transcript.toPlainText()
    assert "the engine broke" in window.statusBar().currentMessage()
    assert store.messages(window.session.id) == [] and window.messages == []


def _refuses_connections(address: str) -> bool:
    host, port = address.removeprefix("http://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_serve_api_answers_on_the_chat_engine_and_stops(qtbot, open_window, tiny_model):
    window, bridge, _ = open_window(spec=str(tiny_model))
    name = _ready(qtbot, bridge)
    assert bridge.server_address is None and not window.server_label.isVisible()

    window.serve_action.trigger()
    address = bridge.server_address
    assert window.serve_action.isChecked()
    assert address is not None and address.startswith("http://127.0.0.1:")
    assert window.server_label.isVisible() and window.server_label.text() == f"API: {address}"
    with urllib.request.urlopen(address + "/v1/models", timeout=30) as response:
        assert response.status == 200
        assert json.load(response)["data"][0]["id"] == name  # the engine the chat uses

    with qtbot.waitSignal(bridge.serverStopped, timeout=WAIT_MS):
        window.serve_action.trigger()
        assert not window.serve_action.isChecked() and bridge.server_address is None
    assert _refuses_connections(address)
    assert not window.server_label.isVisible() and window.serve_action.isEnabled()


def test_a_taken_port_unchecks_serve_api_and_says_why(qtbot, open_window, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        window, bridge, _ = open_window(engine=FakeEngine(tmp_path), server_port=port)
        window.serve_action.trigger()
    assert not window.serve_action.isChecked() and bridge.server_address is None
    message = window.statusBar().currentMessage()
    assert f"cannot listen on 127.0.0.1:{port}" in message and "\n" not in message
    assert not window.server_label.isVisible()


def test_closing_the_window_stops_the_api_server(qtbot, open_window, tmp_path):
    window, bridge, _ = open_window(engine=FakeEngine(tmp_path))
    window.serve_action.trigger()
    address = bridge.server_address
    assert address is not None
    with qtbot.waitSignal(bridge.serverStopped, timeout=WAIT_MS):
        window.close()
    assert bridge.server_address is None and _refuses_connections(address)


def test_the_app_package_does_not_import_mlx():
    code = ("import sys, app.main_window, core.server; "
            "sys.exit(any(m.split('.')[0] == 'mlx' for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
