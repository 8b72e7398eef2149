"""Issue 45.6: small and large windows. At 640x480 the chat kept ~140 px while the panels kept
theirs and panel rows overlapped; the window could not even be made that small (the open
panels held it at 736 px high). Now a small window folds the panels to their one-line
summaries and the chat keeps 400 px; a large one gives the user's folds back."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QRect  # noqa: E402
from PySide6.QtWidgets import QWidget  # noqa: E402

from app.window_fit import CHAT_MIN_WIDTH  # noqa: E402
from core.engine.types import DoneEvent, RequestStats  # noqa: E402
from tests.app.window_fakes import WAIT_MS, ScriptedEngine, wait_ready  # noqa: E402

REPLY = (
    "Here is one:\n\n```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```\n\n"
    "Call it as `add(2, 3)`; it returns the sum of its two arguments, whatever they are."
)


def _rect(widget: QWidget, window: QWidget) -> QRect:
    return QRect(widget.mapTo(window, widget.rect().topLeft()), widget.size())


def _apart(window, widgets) -> None:
    rects = [(w, _rect(w, window)) for w in widgets if w.isVisible() and w.width() > 0]
    for i, (one, a) in enumerate(rects):
        assert window.rect().contains(a), f"{one.objectName() or type(one).__name__} is cut"
        for other, b in rects[i + 1 :]:
            assert not a.intersects(b), (one, other, a, b)


def _check(qtbot, window, width, height) -> None:
    window.resize(width, height)
    qtbot.waitUntil(lambda: (window.width(), window.height()) == (width, height), timeout=WAIT_MS)
    qtbot.wait(50)  # the layouts settle
    middle = window.splitter.widget(1)
    assert middle.width() >= CHAT_MIN_WIDTH
    _apart(window, [window.sessions, middle, window.panels])
    _apart(window, [window.chat_header, window.chat, window.composer])
    _apart(window, [window.menuBar(), window.toolbar, window.centralWidget(), window.statusBar()])
    viewport = window.chat.scroll_area.viewport().width()
    for i in range(window.chat.message_count()):  # nothing wider than the chat: nothing cut
        message = window.chat.message_widget(i)
        assert message.geometry().right() < viewport, (i, message.width(), viewport)


def test_640x480_folds_the_panels_and_1600x1000_gives_them_back(qtbot, open_window, tmp_path):
    engine = ScriptedEngine(tmp_path, hold=True)
    window, bridge, _store = open_window(engine=engine)
    wait_ready(qtbot, bridge)
    window.sections["memory"].set_collapsed(True)  # the user's fold, kept
    window.composer.set_text("Write a Python function that adds two numbers, with types")
    window.composer.send()
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS):
        engine.handles[0].end(
            DoneEvent(REPLY, RequestStats(prompt_tokens=9, computed_tokens=9, completion_tokens=40))
        )
    _check(qtbot, window, 640, 480)
    assert all(section.collapsed for section in window.sections.values())
    assert window.sections["cache"].summary.isVisible()  # its one line
    assert window.settings.collapsed_panels == {"memory"}  # the small window's folds: not saved
    _check(qtbot, window, 1600, 1000)
    assert not window.sections["cache"].collapsed and window.sections["memory"].collapsed
    assert window.panels.width() > 250 and window.sessions.width() >= 120
    _check(qtbot, window, 1280, 800)
