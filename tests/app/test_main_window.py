"""The main window against the real engine on a tiny model, and a fake engine for the
error paths. Every test waits on signals."""

from __future__ import annotations

import json
import os
import re

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import urllib.request  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtCore import QSettings, Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from app.bridge import EngineBridge  # noqa: E402
from app.main_window import MainWindow  # noqa: E402
from app.settings_dialogs import AppSettings  # noqa: E402
from core.chat_store import ChatStore  # noqa: E402
from core.engine import Engine, RequestHandle  # noqa: E402
from core.engine_types import DoneEvent, ErrorEvent, GenerationRequest, RequestStats, TokenEvent  # noqa: E402
from core.errors import UserError  # noqa: E402
from core.model_loader import ModelInfo  # noqa: E402
from core.paths import chats_db_path  # noqa: E402

WAIT_MS = 60000
GREEDY = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 16, "seed": None}


def _info(name: str = "fake-model") -> ModelInfo:
    return ModelInfo(spec=name, name=name, path="/fake", model_type="llama", fingerprint="0" * 16,
                     weights_format="float32", weight_bytes=1000, context_length=512, num_layers=1,
                     load_seconds=0.0)


class FakeEngine(Engine):
    """The real interface without a thread: scripted loads and scripted replies."""

    def __init__(self, data_root, load_error: str | None = None, events: tuple = (),
                 switch_error: str | None = None):
        super().__init__(data_root, model_spec=None)
        self.load_error, self.events, self.switch_error = load_error, events, switch_error
        self.requests: list[GenerationRequest] = []
        self.forgotten: list[str] = []
        self._info = None if load_error else _info()

    def start(self) -> Engine:
        return self

    def wait_ready(self, timeout: float | None = None) -> ModelInfo:
        if self.load_error is not None:
            raise UserError(self.load_error)
        return self._info

    def load(self, spec: str, weights_format: str = "auto", timeout: float | None = None) -> ModelInfo:
        if self.switch_error is not None:
            raise UserError(self.switch_error)
        self._info = _info(spec)
        return self._info

    def submit(self, request: GenerationRequest) -> RequestHandle:
        self.requests.append(request)
        handle = RequestHandle(request)
        for event in self.events:
            handle._emit(event)
        handle._finish()
        return handle

    def forget_session(self, session: str) -> None:
        self.forgotten.append(session)

    def shutdown(self, timeout: float = 10.0) -> None:
        pass


@pytest.fixture
def open_window(qtbot, tmp_path):
    """open_window(spec=..., engine=...) -> (window, bridge, store); shut down afterwards.
    The data folder is tmp_path, so a second window in one test finds the first's chats."""
    opened = []

    def open_(spec: str | None = None, engine: Engine | None = None, server_port: int = 0):
        bridge = EngineBridge(tmp_path, spec, engine=engine)
        store = ChatStore(chats_db_path(tmp_path))
        settings = AppSettings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
        window = MainWindow(bridge, store, settings, server_port=server_port)
        qtbot.addWidget(window)
        window.show()
        opened.append((window, bridge, store))
        return window, bridge, store

    def close(window, bridge, store) -> None:
        if (window, bridge, store) in opened:
            opened.remove((window, bridge, store))
            window.close()
            bridge.shutdown()
            store.close()

    open_.close = close
    yield open_
    for window, bridge, store in list(opened):
        close(window, bridge, store)


def _ready(qtbot, bridge: EngineBridge) -> str:
    with qtbot.waitSignal(bridge.modelReady, timeout=WAIT_MS) as ready:
        bridge.start()
    return ready.args[0]


def _greedy(window, store, **changes) -> None:
    store.update_session(window.session.id, settings={**GREEDY, **changes})
    window.session = store.get_session_by_id(window.session.id)


def _turn(qtbot, window, bridge, text: str) -> tuple[str, dict]:
    window.composer.input.setPlainText(text)
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    return done.args[0], done.args[1]


def test_a_turn_streams_into_the_chat_and_is_stored(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    assert not window.composer.send_button.isEnabled()  # the window is up before the model
    progress = []
    bridge.loadProgress.connect(lambda stage, fraction: progress.append((stage, fraction)))
    name = _ready(qtbot, bridge)
    assert progress and all(stage and (fraction == -1.0 or 0 <= fraction <= 1) for stage, fraction in progress)
    assert window.composer.send_button.isEnabled() and window.model_label.text() == name
    _greedy(window, store, max_tokens=24)

    tokens, streamed = [], []
    bridge.token.connect(tokens.append)
    bridge.token.connect(lambda _: streamed.append(window.chat.message_count()))
    qtbot.keyClicks(window.composer.input, "Hello there")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
        assert window.composer.stop_button.isEnabled() and not window.composer.send_button.isEnabled()
    reply, stats = done.args

    assert reply and "".join(tokens) == reply and streamed and set(streamed) == {2}
    assert window.chat.message_count() == 2
    assert (window.chat.message_role(0), window.chat.message_text(0)) == ("user", "Hello there")
    assert (window.chat.message_role(1), window.chat.message_text(1)) == ("assistant", reply)
    assert stats["completion_tokens"] > 0 and stats["finish_reason"] in ("stop", "length")
    assert window.speed_label.text() == f"{stats['decode_tps']:.1f} tok/s"
    assert window.composer.send_button.isEnabled() and window.composer.text() == ""
    stored = store.messages(window.session.id)
    assert [(m.role, m.content) for m in stored] == [("user", "Hello there"), ("assistant", reply)]
    assert stored[1].stats == stats
    assert window.session.title == "Hello there"  # titled by its first message
    assert window.sessions.current_id() == window.session.id


def test_stop_ends_the_reply_early_and_keeps_it(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    _ready(qtbot, bridge)
    _greedy(window, store, max_tokens=400)
    qtbot.keyClicks(window.composer.input, "Tell me a long story")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
            qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Escape)  # Esc stops, like the Stop button
    reply, stats = done.args
    assert stats["finish_reason"] == "cancelled" and stats["completion_tokens"] < 400
    assert "Stopped" in window.state_label.text()
    assert not window.composer.stop_button.isEnabled() and window.composer.send_button.isEnabled()
    assert store.messages(window.session.id)[-1].content == reply
    assert window.chat.message_text(1) == reply


def test_regenerate_replaces_the_last_reply(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    _ready(qtbot, bridge)
    _greedy(window, store)
    first, _ = _turn(qtbot, window, bridge, "one")
    second, _ = _turn(qtbot, window, bridge, "two")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        window.chat.regenerateRequested.emit()
    again, stats = done.args
    assert again == second  # greedy: the same reply, from a prompt that was cached
    assert stats["cached_tokens"] > 0
    assert [(m.role, m.content) for m in store.messages(window.session.id)] == [
        ("user", "one"), ("assistant", first), ("user", "two"), ("assistant", second)]
    assert window.chat.message_count() == 4


def test_edit_and_resend_the_last_message(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    _ready(qtbot, bridge)
    _greedy(window, store)
    first, _ = _turn(qtbot, window, bridge, "one")
    _turn(qtbot, window, bridge, "two")

    window.chat.editRequested.emit("two")
    assert window.composer.editing and window.composer.text() == "two"
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Escape)  # cancel: nothing changes
    assert not window.composer.editing and len(store.messages(window.session.id)) == 4

    window.chat.editRequested.emit("two")
    window.composer.set_text("three")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    stored = [(m.role, m.content) for m in store.messages(window.session.id)]
    assert stored == [("user", "one"), ("assistant", first), ("user", "three"), ("assistant", done.args[0])]
    assert [window.chat.message_text(i) for i in range(4)] == [content for _, content in stored]


def test_sessions_switch_and_come_back_after_a_restart(qtbot, open_window, tiny_model, tmp_path):
    window, bridge, store = open_window(spec=str(tiny_model))
    _ready(qtbot, bridge)
    _greedy(window, store)
    first_reply, _ = _turn(qtbot, window, bridge, "first chat")
    first_id = window.session.id
    _turn(qtbot, window, bridge, "first chat, again")

    window.new_action.trigger()
    assert window.session.id != first_id and window.chat.message_count() == 0
    assert window.session.settings == GREEDY  # a new chat keeps the current settings
    _turn(qtbot, window, bridge, "second chat")
    assert len(window.cache_panel.plotted_turns) == 1

    window.sessions.sessionSelected.emit(first_id)
    assert window.session.id == first_id and window.chat.message_count() == 4
    assert window.chat.message_text(1) == first_reply
    assert len(window.cache_panel.plotted_turns) == 2
    open_window.close(window, bridge, store)

    window, bridge, store = open_window(spec=str(tiny_model))  # a restart: new engine, same data
    assert window.session.id == first_id  # the most recent chat opens
    _ready(qtbot, bridge)
    assert window.sessions.list.count() == 2
    _reply, stats = _turn(qtbot, window, bridge, "first chat, after a restart")
    assert stats["restored_tokens"] > 0  # its KV came back from the disk cache
    assert window.cache_panel.value_text("lastTurn").split()[0] == f"{stats['prompt_tokens']:,}"
    assert f"{stats['restored_tokens']:,} disk" in window.cache_panel.value_text("lastTurn")


def test_panels_show_the_engines_figures_after_a_turn(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    _ready(qtbot, bridge)
    _greedy(window, store)
    _turn(qtbot, window, bridge, "hello")
    with qtbot.waitSignal(bridge.statsUpdated, timeout=WAIT_MS) as polled:
        pass
    figures = polled.args[0]
    stats = bridge.engine.stats()
    cache = stats.cache
    assert figures["pages_total"] == cache.pages_total and figures["pages_used"] == cache.pages_used
    assert figures["weight_bytes"] == stats.model.weight_bytes > 0
    assert figures["rss_bytes"] > 0 and figures["mlx_active_bytes"] > 0
    capacity = f"{cache.pages_total * cache.page_size:,} tokens"
    assert capacity in window.memory_panel.value_text("poolCapacity")
    assert window.memory_panel.series_points("rss") >= 1
    assert len(window.cache_panel.plotted_turns) == 1
    turn = store.messages(window.session.id)[-1].stats
    assert list(window.cache_panel.computed_set.at(i) for i in range(1)) == [turn["computed_tokens"]]


def test_a_load_failure_shows_the_error_and_keeps_the_input_off(qtbot, open_window, tmp_path):
    window, bridge, _ = open_window(engine=FakeEngine(tmp_path, load_error="no model at /nope"))
    with qtbot.waitSignal(bridge.loadFailed, timeout=WAIT_MS) as failed:
        bridge.start()
    assert failed.args == ["no model at /nope"]
    assert "no model at /nope" in window.state_label.text()
    assert window.error_box is not None and window.error_box.isVisible()
    assert "no model at /nope" in window.error_box.informativeText()
    assert not window.composer.send_button.isEnabled()
    window.error_box.close()


def test_a_failed_model_switch_keeps_the_previous_model(qtbot, open_window, tmp_path):
    engine = FakeEngine(tmp_path, switch_error="broken.gguf is not a GGUF file",
                        events=(TokenEvent("Hi"), DoneEvent("Hi", RequestStats(prompt_tokens=3,
                                                                               computed_tokens=3))))
    window, bridge, store = open_window(engine=engine)
    assert _ready(qtbot, bridge) == "fake-model"
    with qtbot.waitSignal(bridge.loadFailed, timeout=WAIT_MS) as failed:
        window._load("/tmp/broken.gguf")
        assert not window.composer.send_button.isEnabled()  # while it loads
    assert failed.args == ["broken.gguf is not a GGUF file"]
    assert "fake-model stays loaded" in window.error_box.text()
    window.error_box.close()
    assert window.model_label.text() == "fake-model" and window.composer.send_button.isEnabled()
    reply, _ = _turn(qtbot, window, bridge, "still there?")
    assert reply == "Hi"

    engine.switch_error = None
    with qtbot.waitSignal(bridge.modelReady, timeout=WAIT_MS) as ready:
        window._load("other-model")
    assert ready.args == ["other-model"] and window.model_label.text() == "other-model"


def test_an_error_mid_reply_gives_the_message_back(qtbot, open_window, tmp_path):
    engine = FakeEngine(tmp_path, events=(TokenEvent("Hel"), ErrorEvent("the engine broke")))
    window, bridge, store = open_window(engine=engine)
    _ready(qtbot, bridge)
    qtbot.keyClicks(window.composer.input, "first line")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(window.composer.input, "second line")
    assert window.composer.text() == "first line\nsecond line"  # Shift+Enter did not send
    with qtbot.waitSignal(bridge.failed, timeout=WAIT_MS) as failed:
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Enter)
    assert failed.args == ["the engine broke"]
    assert [(m.role, m.content) for m in engine.requests[0].messages] == [("user", "first line\nsecond line")]
    assert window.composer.send_button.isEnabled() and not window.composer.stop_button.isEnabled()
    assert window.composer.text() == "first line\nsecond line"  # given back to send again
    assert [window.chat.message_role(i) for i in range(window.chat.message_count())] == ["error"]
    assert "the engine broke" in window.state_label.text()
    assert store.messages(window.session.id) == []


def test_deleting_a_chat_forgets_its_cache(qtbot, open_window, tmp_path):
    engine = FakeEngine(tmp_path, events=(DoneEvent("ok", RequestStats(prompt_tokens=2, computed_tokens=2)),))
    window, bridge, store = open_window(engine=engine)
    _ready(qtbot, bridge)
    _turn(qtbot, window, bridge, "hello")
    doomed = window.session
    window.sessions.delete(doomed.id)
    with qtbot.waitSignal(window.sessions.sessionDeleted, timeout=WAIT_MS):
        window.sessions.confirm_box.button(QMessageBox.StandardButton.Yes).click()
    assert engine.forgotten == [doomed.name]
    assert window.session is not None and window.session.title is None  # a fresh chat
    assert store.messages(window.session.id) == [] and window.chat.message_count() == 0
    assert [s.id for s in store.list_sessions()] == [window.session.id]


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
        _ready(qtbot, bridge)
        window.serve_action.trigger()
    assert not window.serve_action.isChecked() and bridge.server_address is None
    message = window.state_label.text()
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
    code = ("import sys, app.main_window, app.screenshot, app.bench_gui, core.server; "
            "sys.exit(any(m.split('.')[0] == 'mlx' for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_the_model_picker_switches_models(qtbot, open_window, tmp_path):
    engine = FakeEngine(tmp_path)
    window, bridge, _ = open_window(engine=engine)
    _ready(qtbot, bridge)
    window.model_action.trigger()
    dialog = window.model_dialog
    assert dialog.isVisible()
    dialog._select_spec("gemma3-270m")
    assert dialog.chosen_spec() == "gemma3-270m"
    loading = []
    bridge.modelLoading.connect(lambda spec: loading.append((spec, window.state_label.text())))
    with qtbot.waitSignal(bridge.modelReady, timeout=WAIT_MS) as ready:
        dialog.accept()
    assert ready.args == ["gemma3-270m"]
    assert len(loading) == 1 and loading[0][0] == "gemma3-270m"
    assert re.fullmatch(r"Loading gemma-3-270m.* \(about [\d,]+ MB in memory\)…", loading[0][1])
    assert window.model_label.text() == "gemma3-270m" and window.settings.last_model == "gemma3-270m"
    assert window.composer.send_button.isEnabled()


# -- races and state: a scripted engine whose replies the test releases --

class _Handle(RequestHandle):
    """A held reply: Stop (cancel) ends it with what it streamed so far, as the engine does."""

    def __init__(self, request: GenerationRequest):
        super().__init__(request)
        self.streamed = ""
        self.ended = False

    def stream(self, text: str) -> None:
        self.streamed += text
        self._emit(TokenEvent(text))

    def end(self, event) -> None:
        if not self.ended:
            self.ended = True
            self._emit(event)
            self._finish()

    def cancel(self) -> None:
        super().cancel()
        self.end(DoneEvent(self.streamed, RequestStats(prompt_tokens=4, computed_tokens=4,
                                                       completion_tokens=len(self.streamed),
                                                       finish_reason="cancelled")))


class ScriptedEngine(FakeEngine):
    """Replies "reply N" at once; with ``hold`` set, the test streams and ends each reply."""

    def __init__(self, data_root, hold: bool = False):
        super().__init__(data_root)
        self.hold = hold
        self.handles: list[_Handle] = []
        self.replies: list = []  # events to end the next replies with (default: "reply N")

    def submit(self, request: GenerationRequest) -> RequestHandle:
        self.requests.append(request)
        handle = _Handle(request)
        self.handles.append(handle)
        if not self.hold:
            text = f"reply {len(self.requests)}"
            handle.end(self.replies.pop(0) if self.replies else
                       DoneEvent(text, RequestStats(prompt_tokens=4, computed_tokens=4, completion_tokens=2)))
        return handle


def _stored(store, window) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in store.messages(window.session.id)]


def _shown(window) -> list[tuple[str, str]]:
    return [(window.chat.message_role(i), window.chat.message_text(i)) for i in range(window.chat.message_count())]


def _scripted(qtbot, open_window, tmp_path, hold: bool = False):
    engine = ScriptedEngine(tmp_path, hold=hold)
    window, bridge, store = open_window(engine=engine)
    _ready(qtbot, bridge)
    return window, bridge, store, engine


def test_regenerate_while_editing_replaces_only_the_last_turn_and_keeps_the_draft(qtbot, open_window, tmp_path):
    window, bridge, store, _ = _scripted(qtbot, open_window, tmp_path)
    _turn(qtbot, window, bridge, "one")
    _turn(qtbot, window, bridge, "two")
    window.chat.editRequested.emit("two")
    window.composer.set_text("two, edited")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        window.regenerate_action.trigger()
    assert _stored(store, window) == [("user", "one"), ("assistant", "reply 1"), ("user", "two"),
                                      ("assistant", "reply 3")]
    assert _shown(window) == _stored(store, window)
    assert window.composer.text() == "two, edited" and window.composer.editing  # the draft stays

    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)  # the edit still replaces one turn
    assert _stored(store, window) == [("user", "one"), ("assistant", "reply 1"), ("user", "two, edited"),
                                      ("assistant", "reply 4")]


def test_a_reply_stopped_before_its_first_token_leaves_nothing(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path)
    _turn(qtbot, window, bridge, "one")
    engine.replies.append(DoneEvent("", RequestStats(prompt_tokens=4, finish_reason="cancelled")))
    _turn(qtbot, window, bridge, "two")
    assert _stored(store, window) == [("user", "one"), ("assistant", "reply 1")]  # no empty reply
    assert _shown(window) == _stored(store, window)
    assert window.composer.text() == "two"  # given back to send again
    assert len(window.cache_panel.turns) == 1
    assert "Stopped" in window.state_label.text()

    # regenerate after a cancelled reply: the previous reply stays when this one is stopped at once
    engine.replies.append(DoneEvent("", RequestStats(prompt_tokens=4, finish_reason="cancelled")))
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        window.regenerate()
    assert _stored(store, window) == [("user", "one"), ("assistant", "reply 1")]
    assert _shown(window) == _stored(store, window)
    assert window.composer.text() == "two"  # the draft is not touched by a regenerate
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        window.regenerate()
    assert _stored(store, window) == [("user", "one"), ("assistant", "reply 4")]
    assert [m.content for m in engine.requests[-1].messages] == ["one"]


def test_after_an_error_a_new_send_shows_what_is_stored(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path)
    engine.replies.append(ErrorEvent("the engine broke"))
    window.composer.set_text("hello")
    with qtbot.waitSignal(bridge.failed, timeout=WAIT_MS):
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    assert [window.chat.message_role(i) for i in range(window.chat.message_count())] == ["error"]
    _turn(qtbot, window, bridge, "hello")
    assert _stored(store, window) == [("user", "hello"), ("assistant", "reply 2")]
    assert _shown(window) == _stored(store, window)


def test_a_failed_regenerate_keeps_the_previous_reply(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path)
    _turn(qtbot, window, bridge, "one")
    engine.replies.append(ErrorEvent("the engine broke"))
    with qtbot.waitSignal(bridge.failed, timeout=WAIT_MS):
        window.regenerate()
    assert _stored(store, window) == [("user", "one"), ("assistant", "reply 1")]
    assert _shown(window) == _stored(store, window) + [("error", "the engine broke")]
    assert window.composer.text() == ""  # nothing to give back: "one" is still there
    assert len(window.cache_panel.turns) == 1


def test_an_edit_with_bad_settings_loses_nothing(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path)
    _turn(qtbot, window, bridge, "one")
    _turn(qtbot, window, bridge, "two")
    store.update_session(window.session.id, settings={"top_p": 0.0})  # written by hand, say
    window.session = store.get_session_by_id(window.session.id)
    window.chat.editRequested.emit("two")
    window.composer.set_text("deux")
    for _ in range(2):
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
        assert "Check the chat settings" in window.state_label.text()
        assert len(_stored(store, window)) == 4 and _shown(window) == _stored(store, window)
        assert window.composer.editing and window.composer.text() == "deux"
    window.regenerate()
    assert len(_stored(store, window)) == 4 and _shown(window) == _stored(store, window)
    assert len(engine.requests) == 2


def test_deleting_the_open_chat_while_it_generates(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path, hold=True)
    window.composer.set_text("hello")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    doomed = window.session
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[-1].stream("Hel")
    # the list is disabled during a reply; the chat may still go (another process, say)
    store.delete_session(doomed.id)
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):  # the reply is stopped
        window.sessions.sessionDeleted.emit(doomed.id, doomed.name)
    assert engine.handles[-1].cancelled and engine.forgotten == [doomed.name]
    assert window.session is not None and window.session.created_at > doomed.created_at  # a fresh chat
    assert window.chat.message_count() == 0 and window.composer.send_button.isEnabled()
    assert [s.id for s in store.list_sessions()] == [window.session.id]
    assert window.sessions.current_id() == window.session.id


def test_closing_the_window_mid_reply_keeps_what_came(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path, hold=True)
    session_id = window.session.id
    window.composer.set_text("hello")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
        engine.handles[-1].stream("Hel")
    window.close()
    assert engine.handles[-1].cancelled
    open_window.close(window, bridge, store)  # what the app does next: shutdown, close the store
    with ChatStore(chats_db_path(tmp_path)) as reopened:
        assert [(m.role, m.content) for m in reopened.messages(session_id)] == [("user", "hello"),
                                                                                ("assistant", "Hel")]


def test_no_model_can_be_picked_while_the_first_one_loads(qtbot, open_window, tmp_path):
    import threading

    class SlowEngine(FakeEngine):
        def __init__(self, data_root):
            super().__init__(data_root)
            self.loaded = threading.Event()

        def wait_ready(self, timeout=None):
            self.loaded.wait(timeout)
            return super().wait_ready()

    engine = SlowEngine(tmp_path)
    window, bridge, _ = open_window(engine=engine)
    assert window.model_action.isEnabled()
    bridge.start()
    assert not window.model_action.isEnabled()  # the pick would be dropped: load_model refuses
    with qtbot.waitSignal(bridge.modelReady, timeout=WAIT_MS):
        engine.loaded.set()
    assert window.model_action.isEnabled()


STORE_CALLS = ("list_sessions", "search", "create_session", "get_session_by_id", "messages", "add_turn",
               "replace_last_turn", "update_session", "rename_session", "delete_session")


@pytest.mark.parametrize("broken", STORE_CALLS)
def test_a_store_error_anywhere_gives_a_one_line_message(qtbot, open_window, tmp_path, monkeypatch, broken):
    from core.errors import StoreError

    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path)
    _turn(qtbot, window, bridge, "one")
    other = store.create_session()
    message = f"{store.path} is locked by another RadixChat process; close it or use another --data-dir"

    def fail(*args, **kwargs):
        raise StoreError(message)

    monkeypatch.setattr(store, broken, fail)
    shown = []

    def said() -> None:  # each action that failed said so, in one line, in the window
        text = window.state_label.text() if "locked" in window.state_label.text() else \
            window.sessions.error_label.text()
        if "locked" in text:
            assert "\n" not in text
            shown.append(text)
        window.state_label.clear()
        window.sessions.error_label.clear()

    def act(action) -> None:
        action()
        if window._generating:
            with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
                pass
        said()

    act(lambda: window.send("two"))
    act(window.regenerate)
    act(lambda: window._save_session_settings(dict(GREEDY), "Be brief."))
    act(window.new_chat)  # the open chat has messages: a new one is made
    act(lambda: window.sessions.sessionSelected.emit(other.id))
    act(lambda: window.sessions._on_renamed(window.session.id, "renamed"))
    window.sessions.search.setText("one")
    act(window.sessions.refresh)
    window.sessions.search.clear()
    act(window.sessions.refresh)
    window.sessions.delete(window.sessions.list.item(0).data(Qt.ItemDataRole.UserRole))
    act(lambda: window.sessions.confirm_box.button(QMessageBox.StandardButton.Yes).click())
    act(lambda: MainWindow(bridge, store, window.settings).deleteLater())  # a second window opening
    assert shown  # the broken call was made, and the user was told


def test_chat_settings_reach_the_engine_and_survive_a_restart(qtbot, open_window, tmp_path):
    window, bridge, store, engine = _scripted(qtbot, open_window, tmp_path)
    window.session_settings_action.trigger()
    dialog = window.settings_dialog
    dialog.system_prompt.setPlainText("You are terse.")
    dialog.temperature.setValue(0.3)
    dialog.top_p.setValue(0.9)
    dialog.max_tokens.setValue(77)
    dialog.seed.setValue(42)
    dialog.accept()
    _turn(qtbot, window, bridge, "one")
    request = engine.requests[-1]
    assert [(m.role, m.content) for m in request.messages] == [("system", "You are terse."), ("user", "one")]
    sampling = request.sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens, sampling.seed) == (0.3, 0.9, 77, 42)
    session_id = window.session.id
    open_window.close(window, bridge, store)

    engine = ScriptedEngine(tmp_path)
    window, bridge, store = open_window(engine=engine)
    _ready(qtbot, bridge)
    assert window.session.id == session_id
    _turn(qtbot, window, bridge, "two")
    request = engine.requests[-1]
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "user"]
    assert request.messages[0].content == "You are terse."
    sampling = request.sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens, sampling.seed) == (0.3, 0.9, 77, 42)
    window.session_settings_action.trigger()  # the dialog shows them again
    dialog = window.settings_dialog
    assert (dialog.temperature.value(), dialog.max_tokens.value(), dialog.seed.value()) == (0.3, 77, 42)
    assert dialog.system_prompt.toPlainText() == "You are terse."
    dialog.reject()


def test_a_reply_stopped_at_once_on_the_real_engine_then_regenerate(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    _ready(qtbot, bridge)
    _greedy(window, store)
    first, _ = _turn(qtbot, window, bridge, "one")
    window.composer.set_text("two")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
        window.stop_action.trigger()  # before any event of the reply has arrived
    assert done.args[1]["finish_reason"] == "cancelled"
    if done.args[0]:  # the engine got a token out first: kept, as Stop keeps it
        assert _stored(store, window)[-1] == ("assistant", done.args[0])
    else:
        assert _stored(store, window) == [("user", "one"), ("assistant", first)]
        assert window.composer.text() == "two"
    assert _shown(window) == _stored(store, window)
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as again:
        window.regenerate()
    assert again.args[1]["finish_reason"] in ("stop", "length")
    assert _shown(window) == _stored(store, window) and _stored(store, window)[-1] == ("assistant", again.args[0])
