"""Markdown as the chat shows it: GitHub Markdown in a QTextDocument (raw HTML shown as
text), code in the system's fixed-pitch font on a shaded background, each code block
highlighted by Pygments (its fence's language) under a line with that language and a Copy
link, and the streaming trick that keeps a long reply cheap (``freeze_point``: finished
paragraphs are rendered once).

``MarkdownView`` is the read-only widget a message's body is; ``render_markdown`` and
``append_markdown`` work on any document. Colours come from the palette, so light and dark
themes both work.
"""

from __future__ import annotations

import math
import re

from PySide6.QtCore import QEvent, Qt, QUrl
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QFontDatabase,
    QGuiApplication,
    QPalette,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextFrameFormat,
)
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QWidget

COPY_CODE = "copy-code"  # the href of a code block's Copy link (MarkdownView handles it)
FREEZE_CHARS = 1000  # a streaming message re-renders about this much Markdown at most
MARKDOWN_FEATURES = (
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub
    | QTextDocument.MarkdownFeature.MarkdownNoHTML
)


def mix(a: QColor, b: QColor, share: float) -> QColor:
    """``share`` of ``b`` over ``a``."""
    return QColor.fromRgbF(
        *(
            x * (1 - share) + y * share
            for x, y in zip((a.redF(), a.greenF(), a.blueF()), (b.redF(), b.greenF(), b.blueF()))
        )
    )


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Base).lightnessF() < 0.5


def code_background(palette: QPalette) -> QColor:
    return mix(
        palette.color(QPalette.ColorRole.Base),
        palette.color(QPalette.ColorRole.Text),
        0.10 if is_dark(palette) else 0.055,
    )


def render_markdown(document: QTextDocument, text: str, palette: QPalette) -> None:
    """Replace the document with ``text`` as GitHub Markdown (raw HTML shown as text).

    Code is set in the system's fixed-pitch font on a shaded background: each run of
    code-block lines (fenced or indented) moves into a padded frame, inline code gets a
    character background."""
    document.setMarkdown(text, MARKDOWN_FEATURES)
    _style_code(document, 0, palette)


def plain_text(markdown: str) -> str:
    """Markdown as the text a reader sees: no fences, no emphasis marks, no Copy lines."""
    document = QTextDocument()
    document.setMarkdown(markdown, MARKDOWN_FEATURES)
    return document.toPlainText()


def append_markdown(document: QTextDocument, text: str, palette: QPalette) -> None:
    """Append ``text`` to a document ``render_markdown`` filled, as new blocks: the same
    result as rendering both texts joined by a blank line."""
    if not text:
        return
    if document.isEmpty():
        render_markdown(document, text, palette)
        return
    end = document.characterCount() - 1
    cursor = QTextCursor(document)
    cursor.beginEditBlock()
    cursor.setPosition(end)
    last_block, last_chars = cursor.blockFormat(), cursor.blockCharFormat()
    # an inserted fragment's first block merges into the block at the cursor (and an empty
    # block takes its format): a new block takes a one-letter paragraph, and both go again
    cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
    cursor.insertMarkdown("x\n\n" + text, MARKDOWN_FEATURES)
    cursor.setPosition(end)
    cursor.setPosition(end + 2, QTextCursor.MoveMode.KeepAnchor)
    cursor.removeSelectedText()
    cursor.setBlockFormat(last_block)
    cursor.setBlockCharFormat(last_chars)
    cursor.endEditBlock()  # first: inside an edit block, the new frames (tables) are not known yet
    _style_code(document, end + 1, palette)


def freeze_point(text: str) -> int:
    """Where Markdown ``text`` can be cut so that both halves render as the whole does: the
    start of the last whole line that follows a blank line outside code and starts a paragraph
    or a heading (not a list item, a rule, a quote, a table row, code or indented text); 0: none."""
    point, position, fence, blank = 0, 0, "", False
    for line in text.splitlines(keepends=True):
        if fence:
            if line.strip() and set(line.strip()) == {fence[0]} and len(line.strip()) >= len(fence):
                fence = ""
        else:
            if (
                blank
                and position
                and line.endswith("\n")  # a partial line may become anything
                and not line[0].isspace()
                and not _NOT_A_PARAGRAPH.match(line)
            ):
                point = position
            opening = _FENCE.match(line)
            fence = opening.group(1) if opening else ""
        blank = not fence and not line.strip()
        position += len(line)
    return point


_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
# list items, rules, quotes, tables, code fences (two code blocks in a row would join)
_NOT_A_PARAGRAPH = re.compile(r"[-+*_=>|]|\d{1,9}[.)]\s|```|~~~")


def _style_code(document: QTextDocument, start: int, palette: QPalette) -> None:
    """Shade the code in the blocks from position ``start`` on (see ``render_markdown``) and
    space the headings."""
    shade = code_background(palette)
    mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    code_chars = QTextCharFormat()
    code_chars.setFontFamilies(mono.families())
    code_chars.setFontFixedPitch(True)
    inline_chars = QTextCharFormat(code_chars)
    inline_chars.setBackground(shade)

    runs: list[list[int]] = []  # [first, end) positions of consecutive code-block lines
    inline: list[tuple[int, int]] = []
    headings: list[int] = []
    block = document.findBlock(start)
    while block.isValid():
        if block.blockFormat().headingLevel() and block.position() > 0:
            headings.append(block.position())
        if block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeLanguage):
            end = block.position() + block.length() - 1
            if runs and runs[-1][1] + 1 == block.position():
                runs[-1][1] = end
            else:
                runs.append([block.position(), end])
        else:
            fragments = block.begin()
            while not fragments.atEnd():
                fragment = fragments.fragment()
                if fragment.charFormat().fontFixedPitch():
                    inline.append((fragment.position(), fragment.position() + fragment.length()))
                fragments += 1
        block = block.next()

    cursor = QTextCursor(document)
    cursor.beginEditBlock()
    for first, end in inline:
        cursor.setPosition(first)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(inline_chars)
    spaced = QTextBlockFormat()  # headings come with no margins: a little air above them
    spaced.setTopMargin(10)
    spaced.setBottomMargin(2)
    for position in headings:
        cursor.setPosition(position)
        cursor.mergeBlockFormat(spaced)
    frame = QTextFrameFormat()
    frame.setBackground(shade)
    frame.setPadding(8)
    frame.setMargin(0)
    frame.setTopMargin(6)
    frame.setBottomMargin(6)
    frame.setBorder(0)
    styles = _token_styles(is_dark(palette))
    header_chars = QTextCharFormat()
    header_chars.setForeground(palette.color(QPalette.ColorRole.PlaceholderText))
    header_chars.setFontPointSize(max(6.0, mono.pointSizeF() * 0.85))
    link_chars = QTextCharFormat(header_chars)
    link_chars.setAnchor(True)
    link_chars.setAnchorHref(COPY_CODE)
    link_chars.setForeground(palette.color(QPalette.ColorRole.Link))
    for first, end in reversed(runs):  # from the end: a frame shifts the positions after it
        language = str(
            document.findBlock(first).blockFormat().property(QTextFormat.Property.BlockCodeLanguage)
            or ""
        )
        cursor.setPosition(first)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        code = cursor.selection().toPlainText()
        cursor.mergeCharFormat(code_chars)
        _highlight(cursor, first, code, language, styles)
        cursor.setPosition(first)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        inserted = cursor.insertFrame(frame)
        head = inserted.firstCursorPosition()  # a line above the code: its language, Copy
        head.insertBlock(QTextBlockFormat(), header_chars)
        head.movePosition(QTextCursor.MoveOperation.PreviousBlock)
        head.setBlockFormat(QTextBlockFormat())
        head.insertText(f"{language or 'code'}   ", header_chars)
        head.insertText("Copy", link_chars)
    _collapse_frame_neighbours(document, max(0, start - 1), cursor)  # from the block before
    cursor.endEditBlock()


def _token_styles(dark: bool) -> dict:
    """Pygments token type -> its character format, for a light or a dark background."""
    from pygments.styles import get_style_by_name

    style = get_style_by_name("monokai" if dark else "default")
    formats = {}
    for token, spec in style:
        chars = QTextCharFormat()
        if spec["color"]:
            chars.setForeground(QColor(f"#{spec['color']}"))
        if spec["bold"]:
            chars.setFontWeight(700)
        if spec["italic"]:
            chars.setFontItalic(True)
        formats[token] = chars
    return formats


def _highlight(cursor: QTextCursor, first: int, code: str, language: str, styles: dict) -> None:
    """Colour ``code`` (at ``first`` in the cursor's document) by Pygments' lexer for
    ``language``; an unknown or no language: left plain."""
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        lexer = (
            get_lexer_by_name(language.split()[0], stripnl=False, ensurenl=False)
            if language.strip()
            else None
        )
    except ClassNotFound:
        lexer = None
    if lexer is None:
        return
    offset = 0
    for token, value in _tokens(lexer, code):
        while token not in styles and token.parent is not None:
            token = token.parent
        chars = styles.get(token)
        if chars is not None and value and (chars.foreground().style() or chars.fontItalic()):
            cursor.setPosition(first + offset)
            cursor.setPosition(first + offset + len(value), QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(chars)
        offset += len(value)


def _tokens(lexer, code: str):
    """(token type, text) over exactly ``code``: no more than it (a lexer's own newline)."""
    left = len(code)
    for token, value in lexer.get_tokens(code):
        if left <= 0:
            return
        value = value[:left]
        left -= len(value)
        yield token, value


def _collapse_frame_neighbours(document: QTextDocument, start: int, cursor: QTextCursor) -> None:
    """Give the empty blocks that ``insertFrame`` leaves around a frame no height."""
    root = document.rootFrame()
    flat = QTextBlockFormat()
    flat.setLineHeight(0, QTextBlockFormat.LineHeightTypes.FixedHeight.value)
    flat.setTopMargin(0)
    flat.setBottomMargin(0)
    block = document.findBlock(start)
    previous_in_frame = (
        block.previous().isValid() and QTextCursor(block.previous()).currentFrame() != root
    )
    while block.isValid():
        in_frame = QTextCursor(block).currentFrame() != root
        following = block.next()
        next_in_frame = following.isValid() and QTextCursor(following).currentFrame() != root
        if not in_frame and block.length() == 1 and (previous_in_frame or next_in_frame):
            cursor.setPosition(block.position())
            cursor.mergeBlockFormat(flat)
        previous_in_frame = in_frame
        block = following


class MarkdownView(QTextBrowser):
    """Read-only rendered Markdown without scroll bars; its height follows its document.

    Links open in the system browser; nothing else is loaded (no local files, no images)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(40)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)  # Tab does not walk through every message
        self.viewport().setAutoFillBackground(False)  # the bubble (or the chat) shows through
        self.setOpenLinks(False)
        self.anchorClicked.connect(QDesktopServices.openUrl)
        self.document().setDocumentMargin(2)
        self._measuring = False
        self.document().setUndoRedoEnabled(False)  # streaming edits would pile up there
        self._markdown: str | None = None  # the source shown, if Markdown
        self._frozen = 0  # stream_markdown: the source's length that stays rendered ...
        self._frozen_end = 0  # ... and where it ends in the document
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self.setFixedHeight(self.fontMetrics().lineSpacing() + 4)

    def show_markdown(self, text: str) -> None:
        """Show ``text`` as Markdown, colours from the current palette."""
        self._markdown, self._frozen = text, 0
        render_markdown(self.document(), text, self.palette())

    def stream_markdown(self, text: str) -> None:
        """Show ``text``, a longer version of the Markdown shown: the paragraphs already frozen
        stay, only the text after them is rendered again. Once that passes ``FREEZE_CHARS``,
        its finished paragraphs freeze too (see ``freeze_point``), so a render's cost does not
        grow with the reply."""
        document, palette = self.document(), self.palette()
        frozen = (
            self._frozen
            if self._markdown is not None and text.startswith(self._markdown[: self._frozen])
            else 0
        )
        tail = text[frozen:]
        split = freeze_point(tail) if len(tail) > FREEZE_CHARS else 0
        head, rest = (tail[:split], tail[split:]) if split else (tail, "")
        if frozen:  # drop the unfrozen rest, then render the text after the frozen part
            cursor = QTextCursor(document)
            cursor.setPosition(self._frozen_end)
            last_block, last_chars = cursor.blockFormat(), cursor.blockCharFormat()
            cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
            cursor.removeSelectedText()
            cursor.setBlockFormat(last_block)  # the joined block took the removed one's format
            cursor.setBlockCharFormat(last_chars)
            append_markdown(document, head, palette)
        else:
            render_markdown(document, head, palette)
        if split:
            frozen += split
            self._frozen_end = document.characterCount() - 1
            append_markdown(document, rest, palette)
        self._markdown, self._frozen = text, frozen

    def code_at(self, position: int) -> str:
        """The code of the code block at ``position`` in the document (its lines, without
        the line above them that names the language): "" outside code blocks."""
        cursor = QTextCursor(self.document())
        cursor.setPosition(position)
        frame = cursor.currentFrame()
        if frame is None or frame == self.document().rootFrame():
            return ""
        lines, block = [], self.document().findBlock(frame.firstPosition())
        while block.isValid() and block.position() <= frame.lastPosition():
            lines.append(block.text())
            block = block.next()
        return "\n".join(lines[1:])

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802 (Qt override)
        point = event.position().toPoint()
        if event.button() == Qt.MouseButton.LeftButton and self.anchorAt(point) == COPY_CODE:
            QGuiApplication.clipboard().setText(
                self.code_at(self.cursorForPosition(point).position())
            )
            event.accept()
            return
        super().mouseReleaseEvent(event)

    def setPlainText(self, text: str) -> None:  # noqa: N802 (Qt override)
        self._markdown, self._frozen = None, 0
        super().setPlainText(text)

    def natural_width(self) -> float:
        """The width the document takes without wrapping (for shrink-to-fit bubbles)."""
        document = self.document()
        wrap_width = document.textWidth()
        self._measuring = True
        try:
            document.setTextWidth(-1)
            return document.idealWidth()
        finally:
            document.setTextWidth(wrap_width)
            self._measuring = False

    def loadResource(self, kind: int, url: QUrl) -> object:  # noqa: N802 (Qt override)
        return None

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt override)
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and self._markdown is not None:
            self.show_markdown(self._markdown)  # the code shading follows the palette

    def wheelEvent(self, event) -> None:  # noqa: N802 (Qt override)
        event.ignore()  # nothing to scroll here: the chat's scroll area takes it

    def _fit_height(self, size) -> None:
        if not self._measuring:
            self.setFixedHeight(math.ceil(size.height()) + 2 * self.frameWidth())
