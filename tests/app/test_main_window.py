"""The main window against the real engine on a tiny model, and a fake engine for the
error paths. Every test waits on signals. (Races and store failures:
test_main_window_edge_cases.py.)"""

from __future__ import annotations

import dataclasses
import json
import os
import re

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import urllib.request  # noqa: E402

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from app.chat_settings import MAX_TOKENS_LIMIT  # noqa: E402
from core.engine.types import DoneEvent, ErrorEvent, RequestStats, TokenEvent  # noqa: E402
from tests.app.window_fakes import GREEDY, WAIT_MS, FakeEngine, make_greedy, send_turn, wait_ready  # noqa: E402


def test_a_turn_streams_into_the_chat_and_is_stored(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    assert not window.composer.send_button.isEnabled()  # the window is up before the model
    progress = []
    bridge.loadProgress.connect(lambda stage, fraction: progress.append((stage, fraction)))
    name = wait_ready(qtbot, bridge)
    assert progress and all(
        stage and (fraction == -1.0 or 0 <= fraction <= 1) for stage, fraction in progress
    )
    assert window.composer.send_button.isEnabled() and window.model_label.text() == name
    make_greedy(window, store, max_tokens=24)

    tokens, streamed = [], []
    bridge.token.connect(tokens.append)
    bridge.token.connect(lambda _: streamed.append(window.chat.message_count()))
    qtbot.keyClicks(window.composer.input, "Hello there")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
        assert window.composer.stop_button.isEnabled()  # and Send queues behind the reply
        assert window.composer.send_button.toolTip() == "Sends once the reply ends"
    reply, stats = done.args

    assert reply and "".join(tokens) == reply and streamed and set(streamed) == {2}
    assert window.chat.message_count() == 2
    assert (window.chat.message_role(0), window.chat.message_text(0)) == ("user", "Hello there")
    assert (window.chat.message_role(1), window.chat.message_text(1)) == ("assistant", reply)
    assert stats.completion_tokens > 0 and stats.finish_reason in ("stop", "length")
    # with speculative decoding's reply tokens per step where drafts were taken
    per_step = f" · {stats.tokens_per_step:.2f} tok/step" if stats.accepted_tokens else ""
    assert window.speed_label.text() == f"{stats.decode_tps:.1f} tok/s{per_step}"
    assert window.composer.send_button.isEnabled() and window.composer.text() == ""
    stored = store.messages(window.session.id)
    assert [(m.role, m.content) for m in stored] == [("user", "Hello there"), ("assistant", reply)]
    made_with = {"model": name, "sampling": window.sampling()}  # kept for the export
    assert stored[1].stats == {**dataclasses.asdict(stats), **made_with}
    assert window.session.title == "Hello there"  # titled by its first message
    assert window.sessions.current_id() == window.session.id


def test_stop_ends_the_reply_early_and_keeps_it(qtbot, open_window, tmp_path):
    """The reply could run to 32k tokens (a model with that context, which takes many
    seconds): Esc, pressed once the first token is shown, always lands before its end."""
    from core.models.tiny_model import TinyModelSpec, write_tiny_model

    long_context = TinyModelSpec(num_layers=2, max_position_embeddings=MAX_TOKENS_LIMIT + 64)
    model = write_tiny_model(tmp_path / "tiny-long", long_context)
    window, bridge, store = open_window(spec=str(model))
    wait_ready(qtbot, bridge)
    make_greedy(window, store, max_tokens=MAX_TOKENS_LIMIT)
    qtbot.keyClicks(window.composer.input, "Tell me a long story")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
            qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Escape)  # Esc stops, like the Stop button
    reply, stats = done.args
    assert stats.finish_reason == "cancelled" and stats.completion_tokens < MAX_TOKENS_LIMIT
    assert "Stopped" in window.state_label.text()
    assert not window.composer.stop_button.isEnabled() and window.composer.send_button.isEnabled()
    assert store.messages(window.session.id)[-1].content == reply
    assert window.chat.message_text(1) == reply


def test_regenerate_replaces_the_last_reply(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    wait_ready(qtbot, bridge)
    make_greedy(window, store)
    first, _ = send_turn(qtbot, window, bridge, "one")
    second, _ = send_turn(qtbot, window, bridge, "two")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        window.chat.regenerateRequested.emit()
    again, stats = done.args
    assert again == second  # greedy: the same reply, from a prompt that was cached
    assert stats.cached_tokens > 0
    assert [(m.role, m.content) for m in store.messages(window.session.id)] == [
        ("user", "one"),
        ("assistant", first),
        ("user", "two"),
        ("assistant", second),
    ]
    assert window.chat.message_count() == 4


def test_edit_and_resend_the_last_message(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    wait_ready(qtbot, bridge)
    make_greedy(window, store)
    first, _ = send_turn(qtbot, window, bridge, "one")
    send_turn(qtbot, window, bridge, "two")

    window.chat.editRequested.emit("two")
    assert window.composer.editing and window.composer.text() == "two"
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Escape)  # cancel: nothing changes
    assert not window.composer.editing and len(store.messages(window.session.id)) == 4

    window.chat.editRequested.emit("two")
    window.composer.set_text("three")
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    stored = [(m.role, m.content) for m in store.messages(window.session.id)]
    assert stored == [
        ("user", "one"),
        ("assistant", first),
        ("user", "three"),
        ("assistant", done.args[0]),
    ]
    assert [window.chat.message_text(i) for i in range(4)] == [content for _, content in stored]


def test_sessions_switch_and_come_back_after_a_restart(qtbot, open_window, tiny_model, tmp_path):
    window, bridge, store = open_window(spec=str(tiny_model))
    wait_ready(qtbot, bridge)
    make_greedy(window, store)
    first_reply, _ = send_turn(qtbot, window, bridge, "first chat")
    first_id = window.session.id
    send_turn(qtbot, window, bridge, "first chat, again")

    window.new_action.trigger()
    assert window.session.id != first_id and window.chat.message_count() == 0
    assert window.session.settings == GREEDY  # a new chat keeps the current settings
    send_turn(qtbot, window, bridge, "second chat")
    assert len(window.cache_panel.plotted_turns) == 1

    window.sessions.sessionSelected.emit(first_id)
    assert window.session.id == first_id and window.chat.message_count() == 4
    assert window.chat.message_text(1) == first_reply
    assert len(window.cache_panel.plotted_turns) == 2
    open_window.close(window, bridge, store)

    window, bridge, store = open_window(spec=str(tiny_model))  # a restart: new engine, same data
    assert window.session.id == first_id  # the most recent chat opens
    wait_ready(qtbot, bridge)
    assert window.sessions.list.count() == 2
    _reply, stats = send_turn(qtbot, window, bridge, "first chat, after a restart")
    assert stats.restored_tokens > 0  # its KV came back from the disk cache
    assert window.cache_panel.value_text("lastTurn").split()[0] == f"{stats.prompt_tokens:,}"
    assert f"{stats.restored_tokens:,} disk" in window.cache_panel.value_text("lastTurn")


def test_panels_show_the_engines_figures_after_a_turn(qtbot, open_window, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    wait_ready(qtbot, bridge)
    make_greedy(window, store)
    send_turn(qtbot, window, bridge, "hello")
    polled = qtbot.waitSignal(bridge.statsUpdated, timeout=WAIT_MS)
    polled.wait()
    figures = polled.args[0]
    stats = bridge.engine.stats()
    cache = stats.cache
    assert (
        figures.cache.pages_total == cache.pages_total
        and figures.cache.pages_used == cache.pages_used
    )
    assert figures.model.weight_bytes == stats.model.weight_bytes > 0
    assert figures.rss_bytes > 0 and figures.mlx_active_bytes > 0
    capacity = f"{cache.pages_total * cache.page_size:,} tokens"
    assert capacity in window.memory_panel.value_text("poolCapacity")
    assert window.memory_panel.series_points("rss") >= 1
    assert len(window.cache_panel.plotted_turns) == 1
    turn = store.messages(window.session.id)[-1].stats
    assert list(window.cache_panel.computed_set.at(i) for i in range(1)) == [
        turn["computed_tokens"]
    ]


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
    engine = FakeEngine(
        tmp_path,
        switch_error="broken.gguf is not a GGUF file",
        events=(
            TokenEvent("Hi"),
            DoneEvent("Hi", RequestStats(prompt_tokens=3, computed_tokens=3)),
        ),
    )
    window, bridge, store = open_window(engine=engine)
    assert wait_ready(qtbot, bridge) == "fake-model"
    with qtbot.waitSignal(bridge.loadFailed, timeout=WAIT_MS) as failed:
        window._load("/tmp/broken.gguf")
        assert not window.composer.send_button.isEnabled()  # while it loads
    assert failed.args == ["broken.gguf is not a GGUF file"]
    assert "fake-model stays loaded" in window.error_box.text()
    window.error_box.close()
    assert window.model_label.text() == "fake-model" and window.composer.send_button.isEnabled()
    reply, _ = send_turn(qtbot, window, bridge, "still there?")
    assert reply == "Hi"

    engine.switch_error = None
    with qtbot.waitSignal(bridge.modelReady, timeout=WAIT_MS) as ready:
        window._load("other-model")
    assert ready.args == ["other-model"] and window.model_label.text() == "other-model"


def test_an_error_mid_reply_gives_the_message_back(qtbot, open_window, tmp_path):
    engine = FakeEngine(tmp_path, events=(TokenEvent("Hel"), ErrorEvent("the engine broke")))
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    qtbot.keyClicks(window.composer.input, "first line")
    qtbot.keyClick(window.composer.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(window.composer.input, "second line")
    assert window.composer.text() == "first line\nsecond line"  # Shift+Enter did not send
    with qtbot.waitSignal(bridge.failed, timeout=WAIT_MS) as failed:
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Enter)
    assert failed.args == ["the engine broke"]
    assert [(m.role, m.content) for m in engine.requests[0].messages] == [
        ("user", "first line\nsecond line")
    ]
    assert window.composer.send_button.isEnabled() and not window.composer.stop_button.isEnabled()
    assert window.composer.text() == "first line\nsecond line"  # given back to send again
    assert [window.chat.message_role(i) for i in range(window.chat.message_count())] == ["error"]
    assert "the engine broke" in window.state_label.text()
    assert store.messages(window.session.id) == []


def test_deleting_a_chat_forgets_its_cache(qtbot, open_window, tmp_path):
    engine = FakeEngine(
        tmp_path, events=(DoneEvent("ok", RequestStats(prompt_tokens=2, computed_tokens=2)),)
    )
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    send_turn(qtbot, window, bridge, "hello")
    doomed = window.session
    window.sessions.delete(doomed.id)
    with qtbot.waitSignal(window.sessions.sessionDeleted, timeout=WAIT_MS):
        window.sessions.confirm_box.button(QMessageBox.StandardButton.Yes).click()
    assert engine.forgotten == [(doomed.name, "app")]  # the app's chats: their own cache namespace
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
    name = wait_ready(qtbot, bridge)
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
        wait_ready(qtbot, bridge)
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
    code = (
        "import sys, app.main_window, app.screenshot, core.api.server; "
        "sys.exit(any(m.split('.')[0] == 'mlx' for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_the_model_picker_switches_models(qtbot, open_window, tmp_path):
    engine = FakeEngine(tmp_path)
    window, bridge, _ = open_window(engine=engine)
    wait_ready(qtbot, bridge)
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
    assert (
        window.model_label.text() == "gemma3-270m" and window.settings.last_model == "gemma3-270m"
    )
    assert window.composer.send_button.isEnabled()
