"""The chat view: messages, streaming, the per-message buttons, auto-scroll (the Markdown
itself: test_markdown.py)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtCore import Qt, QTimer  # noqa: E402
from PySide6.QtGui import QGuiApplication  # noqa: E402
from PySide6.QtWidgets import QToolButton  # noqa: E402

from app.chat_view import ChatView  # noqa: E402
from app.markdown import MarkdownView, plain_text  # noqa: E402

CHAT = [
    ("system", "Be brief."),
    ("user", "How do I reverse a list?"),
    ("assistant", "Use **slicing**:\n\n```python\nitems[::-1]\n```\n"),
    ("user", "And in place?"),
    ("assistant", "`items.reverse()`"),
]


@pytest.fixture
def view(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 500)
    view.show()
    qtbot.waitExposed(view)
    return view


def _holder(view: ChatView, button: QToolButton) -> int | None:
    """The index of the message showing ``button``, or None."""
    for i in range(view.message_count()):
        if view.message_widget(i).isAncestorOf(button) and button.isVisibleTo(
            view.message_widget(i)
        ):
            return i
    return None


def _body_text(view: ChatView, i: int) -> str:
    return view.message_widget(i).body.toPlainText()


def test_placeholder_until_there_are_messages(view):
    assert view.placeholder.isVisible() and view.message_count() == 0
    view.set_messages(CHAT)
    assert not view.placeholder.isVisible() and view.scroll_area.isVisible()
    assert view.message_count() == 4  # the system message is not shown
    assert [view.message_role(i) for i in range(4)] == ["user", "assistant", "user", "assistant"]
    assert view.message_text(1) == CHAT[2][1]
    view.set_messages([])
    assert view.placeholder.isVisible()
    with pytest.raises(ValueError):
        view.set_messages([("tool", "?")])


def test_streamed_pieces_coalesce_and_the_final_text_wins(view, qtbot):
    view.add_user_message("Hi")
    view.begin_reply()
    assert view.message_count() == 2 and view.message_text(1) == ""
    for piece in ("Hel", "lo", " **wor"):
        view.append_reply(piece)
    assert view.message_text(1) == "Hello **wor"  # raw text is current before any render
    qtbot.waitUntil(lambda: _body_text(view, 1) == "Hello **wor")
    view.end_reply("Hello **world**", "stopped · 3 tokens · 9.8 tok/s")
    assert view.message_text(1) == "Hello **world**"
    assert _body_text(view, 1) == "Hello world"
    note = view.message_widget(1).note
    assert note.isVisible() and note.text() == "stopped · 3 tokens · 9.8 tok/s"
    view.append_reply("late")  # a piece after the end starts a new reply, not a corrupt one
    assert view.message_text(1) == "Hello **world**"


def test_many_streamed_pieces_render_a_few_times(view, qtbot, monkeypatch):
    renders = []
    for name in ("show_markdown", "stream_markdown"):
        original = getattr(MarkdownView, name)
        monkeypatch.setattr(
            MarkdownView,
            name,
            lambda self, text, original=original: (renders.append(text), original(self, text)),
        )
    view.add_user_message("Count")
    view.begin_reply()
    pieces = [f"{i} " for i in range(200)]
    feed = QTimer(view)
    feed.setInterval(1)
    fed: list[str] = []

    def feed_one() -> None:
        fed.append(pieces[len(fed)])
        view.append_reply(fed[-1])
        if len(fed) == len(pieces):
            feed.stop()

    feed.timeout.connect(feed_one)
    feed.start()
    qtbot.waitUntil(lambda: len(fed) == len(pieces), timeout=10000)
    expected = "".join(pieces)
    qtbot.waitUntil(lambda: view.message_widget(1).body.toPlainText() == expected.strip())
    assert renders[-1] == expected
    assert len(renders) < 40, f"{len(renders)} renders for {len(pieces)} pieces"


def test_copy_puts_the_text_or_the_raw_markdown_on_the_clipboard(view, qtbot):
    view.set_messages(CHAT)
    message = view.message_widget(1)
    buttons = message.findChildren(QToolButton, "copyButton")
    assert len(buttons) == 1
    qtbot.mouseClick(buttons[0], Qt.MouseButton.LeftButton)  # as text: what a reader sees
    assert QGuiApplication.clipboard().text() == plain_text(CHAT[2][1])
    assert "**" not in QGuiApplication.clipboard().text()
    message.copy_markdown_action.trigger()
    assert QGuiApplication.clipboard().text() == CHAT[2][1]
    assert len(view.findChildren(QToolButton, "copyButton")) == 4  # one per message


def test_regenerate_and_edit_sit_on_the_last_messages(view, qtbot):
    view.set_messages(CHAT)
    assert len(view.findChildren(QToolButton, "regenerateButton")) == 1
    assert len(view.findChildren(QToolButton, "editButton")) == 1
    assert _holder(view, view.regenerate_button) == 3
    assert _holder(view, view.edit_button) == 2

    with qtbot.waitSignal(view.regenerateRequested):
        qtbot.mouseClick(view.regenerate_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(view.editRequested) as edit:
        qtbot.mouseClick(view.edit_button, Qt.MouseButton.LeftButton)
    assert edit.args == ["And in place?"]

    view.add_user_message("One more")
    assert _holder(view, view.edit_button) == 4
    assert _holder(view, view.regenerate_button) is None and not view.regenerate_button.isVisible()
    view.begin_reply()
    assert _holder(view, view.regenerate_button) == 5
    view.add_error("out of memory")  # an empty interrupted reply makes way for the error
    assert view.message_count() == 6 and view.message_role(5) == "error"
    assert _holder(view, view.regenerate_button) is None  # only a reply is regenerated
    assert _holder(view, view.edit_button) == 4


def test_remove_last_turn(view):
    view.set_messages(CHAT + [("error", "boom")])
    view.remove_last_turn()
    assert [view.message_role(i) for i in range(view.message_count())] == ["user", "assistant"]
    assert _holder(view, view.regenerate_button) == 1 and _holder(view, view.edit_button) == 0
    view.add_user_message("Again")
    view.begin_reply()
    view.append_reply("partial")
    view.remove_last_turn()  # a streaming reply goes with its turn
    assert view.message_count() == 2 and view.message_text(1) == CHAT[2][1]
    view.remove_last_turn()
    assert view.message_count() == 0 and view.placeholder.isVisible()
    view.remove_last_turn()  # nothing left: no error
    assert view.message_count() == 0


def test_set_busy_disables_regenerate_and_edit(view):
    view.set_messages(CHAT)
    view.set_busy(True)
    assert not view.regenerate_button.isEnabled() and not view.edit_button.isEnabled()
    assert view.message_widget(0).copy_button.isEnabled()
    view.add_user_message("next")  # the buttons move but stay disabled
    view.begin_reply()
    assert not view.regenerate_button.isEnabled() and not view.edit_button.isEnabled()
    view.end_reply("done")
    view.set_busy(False)
    assert view.regenerate_button.isEnabled() and view.edit_button.isEnabled()


def test_auto_scroll_follows_at_the_bottom_and_stops_when_scrolled_up(view, qtbot):
    view.resize(320, 220)
    bar = view.scroll_area.verticalScrollBar()
    view.set_messages(
        [
            ("user", f"question {i}") if i % 2 == 0 else ("assistant", f"answer {i}")
            for i in range(8)
        ]
    )
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
    assert view.following

    view.add_user_message("tell me more")
    view.begin_reply()
    view.append_reply("line\n\n" * 10)
    height = bar.maximum()
    qtbot.waitUntil(lambda: bar.maximum() > height + 100 and bar.value() == bar.maximum())
    assert view.following

    bar.setValue(0)  # the user scrolls up
    assert not view.following
    height = bar.maximum()
    view.append_reply("more\n\n" * 10)
    qtbot.waitUntil(lambda: bar.maximum() > height + 100)
    assert bar.value() == 0 and not view.following

    bar.setValue(bar.maximum())  # back at the bottom: following again
    assert view.following
    height = bar.maximum()
    view.end_reply("line\n\n" * 10 + "more\n\n" * 10 + "end\n\n" * 10)
    qtbot.waitUntil(lambda: bar.maximum() > height + 100 and bar.value() == bar.maximum())


def test_user_bubbles_fit_short_text_and_wrap_long_text(view, qtbot):
    view.set_messages([("user", "Hi"), ("user", "a long question " * 40)])
    short, long = view.message_widget(0), view.message_widget(1)
    qtbot.waitUntil(lambda: long.bubble.width() > 0.7 * long.width())
    assert short.bubble.width() < 0.3 * short.width()
    assert long.bubble.width() <= 0.8 * long.width() + 1
    assert long.bubble.geometry().right() == short.bubble.geometry().right()  # both on the right


def test_body_height_follows_its_document(view, qtbot):
    view.set_messages([("assistant", "words " * 200)])
    body = view.message_widget(0).body

    def fits() -> bool:
        return abs(body.height() - body.document().size().height()) <= 1

    qtbot.waitUntil(fits)
    wide = body.height()
    view.resize(350, 500)
    qtbot.waitUntil(lambda: fits() and body.height() > wide)


def test_a_notice_stands_above_the_messages_until_taken_away(view):
    assert view.notice_text() == "" and not view.notice.isVisible()
    view.set_notice("m is a base model")
    assert view.notice_text() == "m is a base model" and view.notice.isVisible()
    assert (
        view.notice.geometry().bottom()
        < view.placeholder.mapTo(view, view.placeholder.rect().topLeft()).y()
    )
    view.set_messages(CHAT)  # another chat opened: the notice stays, once
    assert view.notice_text() == "m is a base model" and view.message_count() == 4
    view.set_notice("")
    assert view.notice_text() == "" and not view.notice.isVisible()


def test_a_replys_thinking_streams_folded_above_it_and_stored_replies_keep_it(view, qtbot):
    view.add_user_message("2+2?")
    view.append_thinking("Two and ")
    view.append_thinking("two.")
    view.append_reply("4")
    assert view.message_thinking(1) == "Two and two."  # current before any render
    fold = view.message_widget(1).thinking
    qtbot.waitUntil(lambda: fold.text == "Two and two.")
    assert fold.isVisible() and fold.button.text() == "Thinking…" and not fold.expanded
    view.end_reply("4", "2 tokens", "Two and two.", 6)
    assert fold.button.text() == "Thought for 6 tokens" and not fold.body.isVisible()
    assert view.message_text(1) == "4" and _body_text(view, 1) == "4"  # never in the reply
    view.set_messages([("user", "2+2?"), ("assistant", "4", "Two and two.", 6), ("user", "ok")])
    again = view.message_widget(1).thinking
    assert not again.isHidden() and again.button.text() == "Thought for 6 tokens"
    assert view.message_widget(0).thinking.isHidden()  # a user message thinks nothing
    assert view.message_widget(2).thinking.isHidden()
