"""Markdown as the chat shows it (app.markdown): styles, shaded code, palettes, and streaming
that renders what a full render shows."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QColor, QFont, QGuiApplication, QPalette, QTextCursor  # noqa: E402

from app.markdown import COPY_CODE, MarkdownView, code_background, freeze_point  # noqa: E402


@pytest.fixture
def body(qtbot):
    """A message body as the chat view shows one."""
    view = MarkdownView()
    qtbot.addWidget(view)
    view.resize(560, 100)
    view.show()
    qtbot.waitExposed(view)
    return view


def _block_with(document, text: str):
    block = document.begin()
    while block.isValid():
        if text in block.text():
            return block
        block = block.next()
    raise AssertionError(f"no block holds {text!r}")


def _fragments(block):
    fragments, it = [], block.begin()
    while not it.atEnd():
        fragments.append(it.fragment())
        it += 1
    return fragments


def test_markdown_renders_bold_and_shaded_fixed_pitch_code(body):
    body.show_markdown(
        "Some **bold** text and <b>raw html</b>.\n\n```python\nx = 1\ny = 2\n```\n\nAfter."
    )
    document = body.document()
    bold = [f for f in _fragments(_block_with(document, "bold")) if f.text() == "bold"]
    assert bold and bold[0].charFormat().fontWeight() == QFont.Weight.Bold
    assert "<b>raw html</b>" in document.toPlainText()  # raw HTML is shown, not interpreted

    code = _block_with(document, "x = 1")
    assert all(f.charFormat().fontFixedPitch() for f in _fragments(code))
    frame = QTextCursor(code).currentFrame()
    assert frame != document.rootFrame()
    assert frame.frameFormat().background().color() == code_background(body.palette())
    # one box per code block
    assert frame == QTextCursor(_block_with(document, "y = 2")).currentFrame()
    assert QTextCursor(_block_with(document, "After.")).currentFrame() == document.rootFrame()


def test_inline_code_is_fixed_pitch_on_a_background(body):
    body.show_markdown("Call `items.reverse()` now.")
    document = body.document()
    (code,) = [f for f in _fragments(document.begin()) if f.text() == "items.reverse()"]
    assert code.charFormat().fontFixedPitch()
    assert code.charFormat().background().color() == code_background(body.palette())


def test_a_dark_palette_rerenders_the_code_background(body):
    body.show_markdown("```\ncode\n```")
    dark = QPalette(body.palette())
    dark.setColor(QPalette.ColorRole.Base, QColor("#1e1e1e"))
    dark.setColor(QPalette.ColorRole.Text, QColor("#e6e6e6"))
    body.setPalette(dark)
    document = body.document()
    frame = QTextCursor(_block_with(document, "code")).currentFrame()
    assert frame.frameFormat().background().color() == code_background(dark)
    assert frame.frameFormat().background().color().lightnessF() < 0.5


def _signature(document) -> list[tuple]:
    """What a reader sees of each block: text, heading, list, code box, spacing, character
    styles."""
    signature, block = [], document.begin()
    while block.isValid():
        fmt = block.blockFormat()
        signature.append(
            (
                block.text(),
                fmt.headingLevel(),
                fmt.topMargin(),
                fmt.bottomMargin(),
                fmt.lineHeightType(),
                block.textList().format().style() if block.textList() else None,
                QTextCursor(block).currentFrame() != document.rootFrame(),
                tuple(
                    (
                        f.text(),
                        f.charFormat().fontWeight(),
                        f.charFormat().fontItalic(),
                        f.charFormat().fontFixedPitch(),
                    )
                    for f in _fragments(block)
                ),
            )
        )
        block = block.next()
    return signature


def test_streaming_renders_what_a_full_render_shows(qtbot):
    """Long replies freeze their finished paragraphs while streaming; the result must not differ."""
    parts = [
        "# Plan\n\n",
        "Some **bold**, *italic* and `code` words. " * 8 + "\n\n",
        "```python\nfor i in range(3):\n    print(i)\n```\n\n",
        "- one\n- two\n  more\n\n",
        "1. a\n2. b\n\n",
        "> quoted\n\n",
        "| a | b |\n|---|---|\n| 1 | 2 |\n\n",
        "## Sub\n\nA [link](https://x.org).\n\n",
        "    indented code\n\n",
        "---\n\n",
        "Para\nwith lines\n\n",
    ]
    text = "".join(parts[(i * 7) % len(parts)] for i in range(45))
    streamed, full = MarkdownView(), MarkdownView()
    for view in (streamed, full):
        qtbot.addWidget(view)
        view.resize(500, 100)
    for end in range(1, len(text) + 37, 37):
        streamed.stream_markdown(text[:end])
    assert streamed._frozen > 0  # it did freeze
    full.show_markdown(text)
    assert _signature(streamed.document()) == _signature(full.document())


def test_freeze_point_cuts_only_before_whole_paragraphs():
    assert freeze_point("a\n\nb\n\nc\n") == 6  # the last one: before "c"
    assert freeze_point("a\n\nb") == 0  # a partial line may still become a list item or a fence
    assert freeze_point("a\n\n```\nx\n\ny\n```\n") == 0  # inside code
    for line in ("- item", "2. item", "> quote", "| cell |", "```py", "---", "    code"):
        assert freeze_point(f"a\n\n{line}\n") == 0, line


# -- issue 45.3: code blocks highlighted, with their language and a Copy link each --

REPLY = (
    "Two blocks:\n\n```python\ndef add(a, b):\n    return a + b  # the sum\n```\n\n"
    "and\n\n```sh\necho hi\n```\n"
)


def _all_fragments(view):
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            yield it.fragment()
            it += 1
        block = block.next()


def test_code_blocks_are_highlighted_under_their_language_and_a_copy_link(qtbot):
    view = MarkdownView()
    qtbot.addWidget(view)
    view.show_markdown(REPLY)
    lines = view.document().toPlainText().splitlines()
    assert lines[2] == "python   Copy" and "sh   Copy" in lines
    text_colour = view.palette().color(view.foregroundRole()).name()
    colours = {f.text(): f.charFormat().foreground().color().name() for f in _all_fragments(view)}
    assert colours["def"] != text_colour and colours["return"] == colours["def"]  # keywords
    assert colours["# the sum"] not in (text_colour, colours["def"])  # a comment
    links = [f for f in _all_fragments(view) if f.charFormat().anchorHref() == COPY_CODE]
    assert [f.text() for f in links] == ["Copy", "Copy"]


def test_a_code_blocks_copy_link_copies_its_code_alone(qtbot):
    view = MarkdownView()
    qtbot.addWidget(view)
    view.resize(500, 300)
    view.show()
    view.show_markdown(REPLY)
    QGuiApplication.clipboard().clear()
    for expected, link in zip(
        ("def add(a, b):\n    return a + b  # the sum", "echo hi"),
        [f for f in _all_fragments(view) if f.charFormat().anchorHref() == COPY_CODE],
        strict=True,
    ):
        cursor = QTextCursor(view.document())
        cursor.setPosition(link.position() + 1)
        qtbot.mouseClick(
            view.viewport(), Qt.MouseButton.LeftButton, pos=view.cursorRect(cursor).center()
        )
        assert QGuiApplication.clipboard().text() == expected


def test_a_message_copies_as_text_or_as_markdown(qtbot):
    from app.chat_view import MessageWidget

    message = MessageWidget("assistant", "Some **bold** and:\n\n```python\nx = 1\n```\n")
    qtbot.addWidget(message)
    message.copy_button.click()  # the button: as text
    assert QGuiApplication.clipboard().text() == "Some bold and:\nx = 1"
    message.copy_markdown_action.trigger()
    assert QGuiApplication.clipboard().text() == message.text
    message.copy_text_action.trigger()
    assert "```" not in QGuiApplication.clipboard().text()
