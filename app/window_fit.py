"""How the main window fits a small screen (issue 45.6): below SMALL_WIDTH x SMALL_HEIGHT
the panels fold to their one-line summaries and the chat keeps CHAT_MIN_WIDTH, the chat
list and the panels sharing the rest; once the window is large again the user's folds and
column widths come back. The user's folds are what they set, never the small window's."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QSplitter

from app.collapsible import CollapsibleSection

SMALL_WIDTH, SMALL_HEIGHT = 1000, 640
CHAT_MIN_WIDTH = 400
PANELS_MIN_WIDTH = 110
SIDE_WIDTH = 180  # the chat list's and the panels' widths in a small window, at most


class WindowFit:
    """The columns of ``splitter`` (chat list, chat, panels) and the panel ``sections``;
    ``user_folds()`` the sections the user folded, ``panels_shown()`` whether the panels
    column is on."""

    def __init__(
        self,
        splitter: QSplitter,
        sections: dict[str, CollapsibleSection],
        user_folds: Callable[[], set[str]],
        panels_shown: Callable[[], bool],
    ):
        self.splitter, self.sections = splitter, sections
        self.user_folds, self.panels_shown = user_folds, panels_shown
        self.small = False
        self.folding = False  # folding for a small window: not the user's choice
        self.wide_sizes: list[int] = []  # the columns' widths before the window got small

    def fit(self, width: int, height: int) -> None:
        """The window is ``width`` x ``height`` now."""
        small = width < SMALL_WIDTH or height < SMALL_HEIGHT
        if small != self.small:
            self.small = small
            if small:
                self.wide_sizes = self.splitter.sizes()
            self.folding = True
            try:
                folded = self.user_folds()
                for name, section in self.sections.items():
                    section.set_collapsed(small or name in folded)
            finally:
                self.folding = False
            if not small and self.wide_sizes:
                self.splitter.setSizes(self.wide_sizes)
        if small:
            self._share_width()

    def _share_width(self) -> None:
        """A small window's columns: the chat CHAT_MIN_WIDTH at least (all of it below
        that), the chat list and the panels halves of the rest, SIDE_WIDTH each at most."""
        total = sum(self.splitter.sizes())
        if total <= 0:
            return
        chat = min(total, max(CHAT_MIN_WIDTH, total - 2 * SIDE_WIDTH))
        side = total - chat
        if self.panels_shown():
            sessions = side // 2
            self.splitter.setSizes([sessions, chat, side - sessions])
        else:
            self.splitter.setSizes([side, chat, 0])
