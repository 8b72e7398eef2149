"""Every action of the main window's menus and toolbar, each checked for its effect; the
panels shown, hidden and folded; Preferences that say they wait for a restart; the
last-used model gone at start. Every test waits on signals."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QAction  # noqa: E402
from PySide6.QtWidgets import QApplication, QLabel, QLineEdit, QToolButton, QWidgetAction  # noqa: E402

from tests.app.window_fakes import (  # noqa: E402
    WAIT_MS,
    ScriptedEngine,
    make_greedy,
    send_turn,
    wait_ready,
)


def window_actions(window) -> dict[str, QAction]:
    """Every action a person can reach in the menu bar and the toolbar, by its text (the
    model button's action included)."""
    found: dict[str, QAction] = {}
    for menu_action in window.menuBar().actions():
        for action in menu_action.menu().actions():
            if not action.isSeparator():
                found[action.text()] = action
    for action in window.toolbar.actions():
        if isinstance(action, QWidgetAction):
            button = window.toolbar.widgetForAction(action)
            if isinstance(button, QToolButton) and button.defaultAction() is not None:
                found[button.defaultAction().text()] = button.defaultAction()
        elif not action.isSeparator():
            found[action.text()] = action
    return {text.split(":")[0].rstrip("…").strip(): action for text, action in found.items()}


def test_every_menu_and_toolbar_action_does_what_it_says(qtbot, open_window, tmp_path):
    engine = ScriptedEngine(tmp_path)
    window, bridge, store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    send_turn(qtbot, window, bridge, "hello")
    first_session = window.session.id

    def new_chat(action):
        action.trigger()
        assert window.session.id != first_session and window.chat.message_count() == 0
        window.sessions.sessionSelected.emit(first_session)

    def regenerate(action):
        with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
            action.trigger()
        assert [m.content for m in engine.requests[-1].messages] == ["hello"]
        assert store.messages(first_session)[-1].content == "reply 2"

    def stop(action):
        engine.hold = True
        window.composer.set_text("long one")
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
        with qtbot.waitSignal(bridge.token, timeout=WAIT_MS):
            engine.handles[-1].stream("Once")
        with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
            action.trigger()
        engine.hold = False
        assert engine.handles[-1].cancelled and done.args[1].finish_reason == "cancelled"
        assert store.messages(first_session)[-1].content == "Once"

    def opens(attribute: str, owner=window):
        def check(action):
            action.trigger()
            dialog = getattr(owner, attribute)
            assert dialog is not None and dialog.isVisible()
            dialog.close()

        return check

    def serve(action):
        action.trigger()
        address = bridge.server_address
        assert address is not None and window.server_label.text().startswith(f"API: {address}")
        with qtbot.waitSignal(bridge.serverStopped, timeout=WAIT_MS):
            action.trigger()
        assert bridge.server_address is None

    def show_panels(action):
        action.trigger()
        assert not window.panels.isVisible() and not action.isChecked()
        action.trigger()
        assert window.panels.isVisible() and action.isChecked()

    def group(action):
        action.trigger()
        dialog = window.server.group_dialog
        assert dialog is not None and dialog.isVisible()
        assert "fake-model" in dialog.windowTitle() + " ".join(
            label.text() for label in dialog.findChildren(QLabel)
        )
        dialog.close()

    def export_chat(action):
        window.chat_files._ask_export_path = lambda stem: (str(tmp_path / "out.json"), "")
        action.trigger()
        assert json.loads((tmp_path / "out.json").read_text())["messages"][0]["content"] == "hello"

    def import_chat(action):
        window.chat_files._ask_import_path = lambda: str(tmp_path / "out.json")
        before = len(store.list_sessions())
        action.trigger()
        assert len(store.list_sessions()) == before + 1 and window.chat.message_count() >= 2
        window.sessions.sessionSelected.emit(first_session)

    def rename_chat(action):
        action.trigger()  # from the Chat menu: the chat open now, edited in the list
        editor = window.sessions.list.viewport().findChild(QLineEdit)
        assert editor is not None and editor.isVisible()
        window.sessions.list.closePersistentEditor(window.sessions.list.currentItem())

    def delete_chat(action):
        action.trigger()
        box = window.sessions.confirm_box
        assert box is not None and box.isVisible() and "Delete" in box.text()
        box.reject()  # No: nothing deleted
        assert store.get_session_by_id(first_session) is not None

    def quits(action):
        action.trigger()
        assert not window.isVisible()

    effects = {
        "New chat": new_chat,
        "Export Chat": export_chat,
        "Import Chat": import_chat,
        "Preferences": opens("app_dialog"),
        "Regenerate Reply": regenerate,
        "Stop": stop,
        "Chat Settings": opens("settings_dialog"),
        "Model": opens("model_dialog"),
        "Downloads": opens("downloads_dialog"),
        "Model Info": opens("model_card"),
        "Serve API": serve,
        "API Settings": opens("settings_dialog", window.server),
        "API Request Log": opens("log_dialog", window.server),
        "Serve Over Several Macs": group,
        "Show Panels": show_panels,
        "Rename Chat": rename_chat,
        "Delete Chat": delete_chat,
        "Quit": quits,  # last: it closes the window
    }
    actions = window_actions(window)
    assert set(actions) == set(effects)  # an action without a check here fails this test
    for text, check in effects.items():
        assert actions[text].isEnabled(), text
        check(actions[text])


def test_show_panels_hides_them_and_is_remembered(qtbot, open_window, tmp_path):
    window, bridge, store = open_window(engine=ScriptedEngine(tmp_path))
    wait_ready(qtbot, bridge)
    assert window.panels.isVisible()
    window.activateWindow()
    qtbot.keyClick(
        window,
        Qt.Key.Key_P,
        Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier,
    )
    assert not window.panels.isVisible() and not window.panels_action.isChecked()
    open_window.close(window, bridge, store)

    window, bridge, store = open_window(engine=ScriptedEngine(tmp_path))
    assert not window.panels.isVisible() and not window.panels_action.isChecked()
    window.panels_action.trigger()
    assert window.panels.isVisible()


def test_panels_fold_to_a_summary_and_stay_folded(qtbot, open_window, tmp_path, tiny_model):
    window, bridge, store = open_window(spec=str(tiny_model))
    wait_ready(qtbot, bridge)
    make_greedy(window, store)
    send_turn(qtbot, window, bridge, "hello")
    with qtbot.waitSignal(bridge.statsUpdated, timeout=WAIT_MS):
        bridge.poll_stats()
    memory, cache = window.sections["memory"], window.sections["cache"]
    qtbot.mouseClick(memory.button, Qt.MouseButton.LeftButton)
    assert memory.collapsed and not window.memory_panel.isVisible()
    summary = memory.summary.text()
    assert memory.summary.isVisible() and summary.startswith("RSS ")
    assert " · MLX " in summary and summary.endswith("% used")
    qtbot.mouseClick(cache.button, Qt.MouseButton.LeftButton)
    assert not window.cache_panel.isVisible()
    assert cache.summary.text().startswith("Last turn 0% cached · first token ")
    assert memory.height() < 60 and cache.height() < 60  # one line each
    QApplication.processEvents()  # the layout settles (no timer: events already posted)
    assert window.chat.height() > 400  # the rest of the window keeps its height
    open_window.close(window, bridge, store)

    window, bridge, store = open_window(spec=str(tiny_model))
    assert window.sections["memory"].collapsed and window.sections["cache"].collapsed
    qtbot.mouseClick(window.sections["memory"].button, Qt.MouseButton.LeftButton)
    assert window.memory_panel.isVisible() and not window.sections["memory"].summary.isVisible()


def test_preferences_say_what_waits_for_a_restart(qtbot, open_window, tmp_path):
    window, bridge, _ = open_window(engine=ScriptedEngine(tmp_path))
    wait_ready(qtbot, bridge)
    window.app_settings_action.trigger()
    dialog = window.app_dialog
    dialog.kv_pool_mb.setValue(512)
    with qtbot.waitSignal(dialog.accepted):
        dialog.accept()
    assert window.state_label.text() == "Restart RadixChat to use the KV pool budget"
    assert window.settings.kv_pool_mb == 512

    window.app_settings_action.trigger()
    window.state_label.clear()
    with qtbot.waitSignal(window.app_dialog.accepted):
        window.app_dialog.accept()  # nothing changed: nothing to say
    assert window.state_label.text() == ""


def test_a_gone_last_model_starts_the_default_and_says_so(qtbot, open_window, tiny_model, tmp_path):
    gone = str(tmp_path / "deleted-model.gguf")
    window, bridge, _ = open_window(spec=gone, fallback_model=str(tiny_model))
    window.settings.last_model = gone
    with qtbot.waitSignal(bridge.modelReady, timeout=WAIT_MS) as ready:
        bridge.start()
    assert ready.args == ["tiny-llama"] and window.model_label.text() == "tiny-llama"
    box = window.error_box
    assert box is not None and box.isVisible()
    assert f"The model you used last, {gone}, could not be loaded" in box.text()
    assert (
        "starts on the default model" in box.text()
        and "deleted-model.gguf" in box.informativeText()
    )
    assert window.settings.last_model == str(tiny_model)  # the next start goes straight to it
    assert window.composer.send_button.isEnabled()
    box.close()
