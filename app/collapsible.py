"""A live panel that folds to a one-line summary.

``CollapsibleSection`` puts a header over a panel: an arrow and the panel's title, which
fold the panel away (or back), and, while folded, the panel's ``summary`` (its main figures
in one line), kept current through the panel's ``summaryChanged`` signal.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.charts import ChartPanel


class CollapsibleSection(QWidget):
    """``panel`` under a header that folds it; ``toggled(collapsed)`` after each fold."""

    toggled = Signal(bool)

    def __init__(self, title: str, panel: ChartPanel, parent: QWidget | None = None):
        super().__init__(parent)
        self.panel = panel
        self.button = QToolButton()
        self.button.setObjectName("sectionButton")
        self.button.setText(title)
        self.button.setCheckable(True)
        self.button.setChecked(True)  # checked: open
        self.button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.button.setArrowType(Qt.ArrowType.DownArrow)
        self.button.setAutoRaise(True)
        self.button.setToolTip(f"Fold the {title.lower()} panel to one line, or open it again")
        self.button.toggled.connect(self._on_button)
        self.summary = QLabel()
        self.summary.setObjectName("sectionSummary")
        self.summary.setForegroundRole(QPalette.ColorRole.PlaceholderText)  # dim
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.summary.hide()
        panel.summaryChanged.connect(self._show_summary)
        self._show_summary(panel.summary)

        self.header = QHBoxLayout()
        self.header.setContentsMargins(4, 2, 8, 2)
        self.header.addWidget(self.button, 0, Qt.AlignmentFlag.AlignLeft)
        self.header.addWidget(self.summary, 1)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addLayout(self.header)
        column.addWidget(panel, 1)

    def _show_summary(self, text: str) -> None:
        self.summary.setText(text)
        self.summary.setToolTip(text)  # whole, where the panel is too narrow for it

    @property
    def collapsed(self) -> bool:
        return not self.button.isChecked()

    def set_collapsed(self, collapsed: bool) -> None:
        self.button.setChecked(not collapsed)

    def _on_button(self, opened: bool) -> None:
        self.panel.setVisible(opened)
        self.summary.setVisible(not opened)
        self.button.setArrowType(Qt.ArrowType.DownArrow if opened else Qt.ArrowType.RightArrow)
        # folded, the section takes one line of the splitter; open, what it is given
        self.setMaximumHeight(16777215 if opened else self.header.sizeHint().height())
        self.toggled.emit(not opened)
