"""A reasoning model's thinking folded above its reply: one line while folded (the
default), "Thinking…" while it streams, "Thought for N tokens" once done, opened and folded
with a click, hidden for a reply without thinking."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QVBoxLayout, QWidget  # noqa: E402

from app.thinking_fold import ThinkingFold  # noqa: E402


@pytest.fixture
def fold(qtbot):
    holder = QWidget()
    fold = ThinkingFold()
    QVBoxLayout(holder).addWidget(fold)
    qtbot.addWidget(holder)
    holder.show()
    qtbot.waitExposed(holder)
    yield fold  # the holder lives as long as the test


def test_a_fold_without_thinking_is_hidden(fold):
    assert not fold.isVisible()
    fold.set_thinking("", streaming=False)
    assert not fold.isVisible()


def test_the_thinking_streams_folded_then_says_how_long_it_was(fold, qtbot):
    fold.set_thinking("Let me", streaming=True)
    assert fold.isVisible() and fold.button.text() == "Thinking…"
    assert not fold.expanded and not fold.body.isVisible()  # folded by default
    fold.set_thinking("Let me see.", tokens=42)
    assert fold.button.text() == "Thought for 42 tokens" and not fold.body.isVisible()
    qtbot.mouseClick(fold.button, Qt.MouseButton.LeftButton)
    assert fold.expanded and fold.body.isVisible() and fold.body.text() == "Let me see."
    assert fold.button.arrowType() == Qt.ArrowType.DownArrow
    qtbot.mouseClick(fold.button, Qt.MouseButton.LeftButton)
    assert not fold.body.isVisible() and fold.button.arrowType() == Qt.ArrowType.RightArrow


def test_an_open_fold_follows_the_streamed_thinking(fold):
    fold.set_thinking("a", streaming=True)
    fold.set_expanded(True)
    fold.set_thinking("a b", streaming=True)
    assert fold.body.text() == "a b"


def test_a_reply_stored_without_a_count_says_it_thought(fold):
    fold.set_thinking("old thoughts")
    assert fold.button.text() == "Thought"
    fold.set_thinking("one", tokens=1)
    assert fold.button.text() == "Thought for 1 token"
