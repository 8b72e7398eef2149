"""The sidebar of chats over a real chat store: order, search, rename, delete, selection."""

from __future__ import annotations

import os
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtCore import QPoint, Qt  # noqa: E402
from PySide6.QtWidgets import QLineEdit, QMessageBox  # noqa: E402

from app.session_list import ID_ROLE, UNTITLED, WHEN_ROLE, SessionList, relative_time  # noqa: E402
from core.chats.store import ChatStore  # noqa: E402
from core.errors import StoreError  # noqa: E402
from core.paths import chats_db_path  # noqa: E402


@pytest.fixture
def store(tmp_path):
    with ChatStore(chats_db_path(tmp_path)) as store:
        yield store


@pytest.fixture
def chats(store):
    """Three chats; "Kyoto" was updated last, then the untitled one, then "Sourdough"."""
    bread = store.create_session(name="bread")
    store.add_message(bread.id, "user", "Sourdough at 75% hydration?")
    untitled = store.create_session(name="empty")
    trip = store.create_session(name="trip")
    store.add_turn(trip.id, "Plan a trip to Kyoto", "Go in April, for the cherry blossoms.")
    return {"trip": trip.id, "untitled": untitled.id, "bread": bread.id}


@pytest.fixture
def session_list(qtbot, store, chats):
    widget = SessionList(store)
    qtbot.addWidget(widget)
    widget.resize(260, 400)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def _ids(widget: SessionList) -> list[int]:
    return [widget.list.item(row).data(ID_ROLE) for row in range(widget.list.count())]


def _titles(widget: SessionList) -> list[str]:
    return [widget.list.item(row).text() for row in range(widget.list.count())]


def _click(qtbot, widget: SessionList, session_id: int, button=Qt.MouseButton.LeftButton) -> None:
    row = _ids(widget).index(session_id)
    pos = widget.list.visualItemRect(widget.list.item(row)).center()
    qtbot.mouseClick(widget.list.viewport(), button, pos=pos)


def test_sessions_show_newest_first_with_their_titles(session_list, chats):
    assert _ids(session_list) == [chats["trip"], chats["untitled"], chats["bread"]]
    assert _titles(session_list) == [
        "Plan a trip to Kyoto",
        UNTITLED,
        "Sourdough at 75% hydration?",
    ]
    assert session_list.list.item(0).data(WHEN_ROLE) == "just now"
    assert (
        session_list.current_id() is None
        and session_list.search.placeholderText() == "Search chats"
    )
    assert session_list.search.isClearButtonEnabled()


def test_search_filters_by_content_and_title_as_you_type(qtbot, session_list, chats):
    qtbot.keyClicks(session_list.search, "cherry")  # only in the assistant's reply
    qtbot.waitUntil(lambda: _ids(session_list) == [chats["trip"]])
    session_list.search.clear()
    qtbot.waitUntil(lambda: len(_ids(session_list)) == 3)
    qtbot.keyClicks(session_list.search, "SOURDOUGH")
    qtbot.waitUntil(lambda: _ids(session_list) == [chats["bread"]])
    assert not session_list.empty_label.isVisible()
    qtbot.keyClicks(session_list.search, " nowhere")
    qtbot.waitUntil(lambda: _ids(session_list) == [])
    assert session_list.empty_label.isVisible()


def test_clicking_a_chat_selects_it(qtbot, session_list, chats):
    with qtbot.waitSignal(session_list.sessionSelected) as picked:
        _click(qtbot, session_list, chats["bread"])
    assert picked.args == [chats["bread"]] and session_list.current_id() == chats["bread"]
    with qtbot.waitSignal(session_list.sessionSelected) as picked:
        qtbot.keyClick(session_list.list, Qt.Key.Key_Up)
    assert picked.args == [chats["untitled"]]
    with qtbot.assertNotEmitted(session_list.sessionSelected):
        _click(qtbot, session_list, chats["untitled"])  # already the current one


def test_select_and_refresh_keep_the_highlight_without_signals(qtbot, session_list, store, chats):
    with qtbot.assertNotEmitted(session_list.sessionSelected):
        session_list.select(chats["bread"])
        newer = store.create_session(name="newer")
        session_list.refresh()
    assert _ids(session_list)[0] == newer.id
    assert session_list.current_id() == chats["bread"]
    assert session_list.list.currentItem().data(ID_ROLE) == chats["bread"]
    session_list.refresh(select_id=newer.id)
    assert session_list.current_id() == newer.id and session_list.list.currentRow() == 0


def test_a_search_that_hides_the_current_chat_keeps_it_current(qtbot, session_list, chats):
    session_list.select(chats["bread"])
    qtbot.keyClicks(session_list.search, "Kyoto")
    qtbot.waitUntil(lambda: _ids(session_list) == [chats["trip"]])
    assert session_list.current_id() == chats["bread"] and not session_list.list.selectedItems()
    session_list.search.clear()
    qtbot.waitUntil(lambda: len(_ids(session_list)) == 3)
    assert session_list.list.currentItem().data(ID_ROLE) == chats["bread"]


def test_rename_in_place_updates_the_store(qtbot, session_list, store, chats):
    session_list.select(chats["untitled"])
    session_list.activateWindow()
    session_list.list.setFocus()
    qtbot.waitUntil(session_list.list.hasFocus)
    qtbot.keyClick(session_list.list, Qt.Key.Key_F2)
    editor = session_list.list.viewport().findChild(QLineEdit)
    assert editor is not None and editor.isVisible() and editor.text() == ""  # not "New chat"
    qtbot.keyClicks(editor, "Trip budget")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: store.get_session_by_id(chats["untitled"]).title == "Trip budget")
    qtbot.waitUntil(lambda: "Trip budget" in _titles(session_list))
    assert _ids(session_list)[0] == chats["untitled"]  # renaming updates it
    assert session_list.current_id() == chats["untitled"]

    session_list.rename(chats["untitled"])  # an empty title: untitled again
    editor = session_list.list.viewport().findChild(QLineEdit)
    assert editor.text() == "Trip budget"
    editor.clear()
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: store.get_session_by_id(chats["untitled"]).title is None)
    qtbot.waitUntil(lambda: _titles(session_list)[0] == UNTITLED)


def test_delete_asks_first_and_only_yes_deletes(qtbot, session_list, store, chats):
    session_list.select(chats["trip"])
    deleted = []
    session_list.sessionDeleted.connect(lambda *args: deleted.append(args))
    session_list.activateWindow()
    session_list.list.setFocus()
    qtbot.waitUntil(session_list.list.hasFocus)
    qtbot.keyClick(session_list.list, Qt.Key.Key_Delete)  # the shortcut, while the list has focus
    box = session_list.confirm_box
    assert box is not None and box.isVisible()
    assert box.text() == "Delete “Plan a trip to Kyoto”? Its messages and cached KV are removed."
    assert box.defaultButton() is box.button(QMessageBox.StandardButton.No)
    box.button(QMessageBox.StandardButton.No).click()
    assert deleted == [] and store.get_session_by_id(chats["trip"]) is not None
    assert len(_ids(session_list)) == 3

    session_list.delete()
    with qtbot.waitSignal(session_list.sessionDeleted) as gone:
        session_list.confirm_box.button(QMessageBox.StandardButton.Yes).click()
    assert gone.args == [chats["trip"], "trip"]
    assert store.get_session_by_id(chats["trip"]) is None and store.messages(chats["trip"]) == []
    assert _ids(session_list) == [chats["untitled"], chats["bread"]]
    assert session_list.current_id() is None


def test_the_context_menu_acts_on_the_chat_under_the_mouse(qtbot, session_list, store, chats):
    session_list.select(chats["trip"])
    row = _ids(session_list).index(chats["bread"])
    pos = session_list.list.visualItemRect(session_list.list.item(row)).center()
    with qtbot.assertNotEmitted(session_list.sessionSelected):
        qtbot.mousePress(session_list.list.viewport(), Qt.MouseButton.RightButton, pos=pos)
        session_list.list.customContextMenuRequested.emit(pos)
    assert session_list.current_id() == chats["trip"]  # a right click does not open the chat
    menu = session_list.context_menu
    assert menu is not None and [a.text() for a in menu.actions()] == ["Rename", "Delete…"]
    menu.actions()[1].trigger()
    menu.close()
    assert "Sourdough" in session_list.confirm_box.text()
    with qtbot.waitSignal(session_list.sessionDeleted):
        session_list.confirm_box.button(QMessageBox.StandardButton.Yes).click()
    assert store.get_session_by_id(chats["bread"]) is None
    assert session_list.current_id() == chats["trip"]
    session_list.list.customContextMenuRequested.emit(QPoint(5, 390))  # below the rows: no menu
    assert session_list.context_menu is menu


def test_new_chat_asks_the_window(qtbot, session_list):
    with qtbot.waitSignal(session_list.newRequested):
        qtbot.mouseClick(session_list.new_button, Qt.MouseButton.LeftButton)


def test_store_errors_show_as_one_line(qtbot, session_list, store, chats, monkeypatch):
    def broken(*args):
        raise StoreError("chats.db is locked by another RadixChat process")

    monkeypatch.setattr(store, "list_sessions", broken)
    with qtbot.waitSignal(session_list.error) as failed:
        session_list.refresh()
    assert failed.args == ["chats.db is locked by another RadixChat process"]
    assert session_list.error_label.isVisible() and "locked" in session_list.error_label.text()
    assert len(_ids(session_list)) == 3  # the last good list stays

    monkeypatch.setattr(store, "rename_session", broken)
    session_list.rename(chats["bread"])
    editor = session_list.list.viewport().findChild(QLineEdit)
    editor.setText("Bread")
    with qtbot.waitSignal(session_list.error):
        qtbot.keyClick(editor, Qt.Key.Key_Return)

    monkeypatch.undo()
    session_list.refresh()
    assert not session_list.error_label.isVisible()


@pytest.mark.parametrize(
    "ago, text",
    [
        (5, "just now"),
        (5 * 60, "5 min ago"),
        (3 * 3600 + 60, "3 h ago"),
    ],
)
def test_relative_time_today(ago, text):
    now = time.mktime((2026, 3, 10, 18, 0, 0, 0, 0, -1))
    assert relative_time(now - ago, now) == text


def test_relative_time_older():
    now = time.mktime((2026, 3, 10, 9, 0, 0, 0, 0, -1))  # a Tuesday
    assert relative_time(time.mktime((2026, 3, 9, 22, 0, 0, 0, 0, -1)), now) == "yesterday"
    assert relative_time(time.mktime((2026, 3, 6, 12, 0, 0, 0, 0, -1)), now) == time.strftime(
        "%A", time.localtime(time.mktime((2026, 3, 6, 12, 0, 0, 0, 0, -1)))
    )
    assert relative_time(time.mktime((2026, 1, 4, 12, 0, 0, 0, 0, -1)), now).endswith(" 4")
    assert relative_time(time.mktime((2024, 1, 4, 12, 0, 0, 0, 0, -1)), now).endswith(" 4, 2024")
