"""Issue 45.2: the window used from the keyboard, as a native app: Tab and Shift+Tab walk the
focus through the window (the message box lets go of it), the focus ring can be seen, F2
and Del act on the chat just clicked (opening it no longer pulls the focus to the message
box), and every menu action shows its shortcut (Ctrl here, Cmd on macOS: Qt maps it)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QKeySequence, QPalette  # noqa: E402
from PySide6.QtWidgets import QApplication, QLineEdit  # noqa: E402

from app.session_list import ID_ROLE  # noqa: E402
from tests.app.window_fakes import ScriptedEngine, wait_ready  # noqa: E402


def _ready(qtbot, open_window, tmp_path):
    window, bridge, store = open_window(engine=ScriptedEngine(tmp_path))
    wait_ready(qtbot, bridge)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    return window, bridge, store


def test_tab_and_shift_tab_walk_the_focus_chain(qtbot, open_window, tmp_path):
    window, _bridge, _store = _ready(qtbot, open_window, tmp_path)
    box = window.composer.input
    box.setFocus()
    qtbot.waitUntil(box.hasFocus)
    chain = [box]
    for _ in range(60):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
        if QApplication.focusWidget() is box:
            break
        chain.append(QApplication.focusWidget())
    assert QApplication.focusWidget() is box, [w.objectName() or type(w).__name__ for w in chain]
    assert "\t" not in window.composer.text()  # Tab moved on, it typed nothing
    assert window.composer.send_button in chain and window.sessions.list in chain
    assert window.sessions.search in chain
    assert len(set(map(id, chain))) == len(chain)  # each once per round
    # Shift+Tab walks it backwards
    qtbot.keyClick(box, Qt.Key.Key_Backtab)
    assert QApplication.focusWidget() is chain[-1]


def test_the_focus_ring_can_be_seen(qtbot, open_window, tmp_path):
    window, _bridge, _store = _ready(qtbot, open_window, tmp_path)
    box = window.composer.input
    highlight = box.palette().color(QPalette.ColorRole.Highlight)

    def ring_pixels() -> int:
        image = box.grab().toImage()
        edge = [image.pixelColor(x, image.height() // 2) for x in (0, 1)]
        edge += [image.pixelColor(image.width() // 2, y) for y in (0, 1)]
        return sum(
            abs(c.red() - highlight.red()) + abs(c.green() - highlight.green()) < 40 for c in edge
        )

    window.sessions.list.setFocus()
    qtbot.waitUntil(window.sessions.list.hasFocus)
    unfocused = ring_pixels()
    box.setFocus()
    qtbot.waitUntil(box.hasFocus)
    assert ring_pixels() == 4 and unfocused == 0  # 2 px of highlight on each side


def test_f2_and_del_act_on_the_chat_just_clicked(qtbot, open_window, tmp_path):
    window, _bridge, store = _ready(qtbot, open_window, tmp_path)
    window.new_action.trigger()
    window.composer.set_text("x")  # not empty: New chat makes a second chat
    second = store.create_session(name="second").id
    window.sessions.refresh()
    listing = window.sessions.list
    item = next(
        listing.item(i) for i in range(listing.count()) if listing.item(i).data(ID_ROLE) == second
    )
    window.composer.input.setFocus()
    qtbot.mouseClick(
        listing.viewport(), Qt.MouseButton.LeftButton, pos=listing.visualItemRect(item).center()
    )
    qtbot.waitUntil(lambda: window.session is not None and window.session.id == second)
    assert listing.hasFocus()  # opening the chat left the focus on the list
    qtbot.keyClick(listing, Qt.Key.Key_F2)
    editor = listing.viewport().findChild(QLineEdit)
    assert editor is not None and editor.isVisible()
    qtbot.keyClick(editor, Qt.Key.Key_Escape)
    qtbot.waitUntil(listing.hasFocus)
    qtbot.keyClick(listing, Qt.Key.Key_Delete)
    box = window.sessions.confirm_box
    assert box is not None and box.isVisible() and "Delete" in box.text()
    box.reject()


def test_every_menu_action_shows_a_shortcut_of_its_own(qtbot, open_window, tmp_path):
    window, _bridge, _store = _ready(qtbot, open_window, tmp_path)
    seen: dict[str, str] = {}
    for menu_action in window.menuBar().actions():
        for action in menu_action.menu().actions():
            if action.isSeparator():
                continue
            keys = action.shortcut().toString(QKeySequence.SequenceFormat.NativeText)
            assert keys, f"{menu_action.text()} › {action.text()} has no shortcut"
            assert keys not in seen, f"{action.text()} and {seen[keys]} share {keys}"
            seen[keys] = action.text()
    assert len(seen) >= 17
