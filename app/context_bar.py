"""The context bar in the status bar: how much of the model's context the open chat uses, and
what its next turn will cost with the cache (only the new message's tokens: everything
before it is served from the cache). Live while a reply streams."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QWidget

NEARLY_FULL = 0.9  # past this share of the context the bar says so


class ContextBar(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("contextBar")
        self.label = QLabel()
        self.bar = QProgressBar()
        self.bar.setTextVisible(False)
        self.bar.setFixedWidth(90)
        self.bar.setFixedHeight(10)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 8, 0)
        row.addWidget(self.label)
        row.addWidget(self.bar)
        self.used = self.context = 0
        self.set_usage(0, 0)

    def set_usage(self, used: int, context: int) -> None:
        """The open chat holds ``used`` tokens of the model's ``context`` (0: no model)."""
        self.used, self.context = used, context
        if context <= 0:
            self.label.setText("Context —")
            self.bar.setRange(0, 1)
            self.bar.setValue(0)
            self.setToolTip("No model loaded")
            return
        self.bar.setRange(0, context)
        self.bar.setValue(min(used, context))
        full = used >= NEARLY_FULL * context
        self.label.setText(f"Context {used:,} / {context:,}" + (" · nearly full" if full else ""))
        self.label.setStyleSheet("color: #c0392b;" if full else "")
        self.setToolTip(
            f"This chat uses {used:,} of the model's {context:,} tokens of context "
            f"({used / context:.0%}). With the cache, your next message costs only its own "
            f"tokens: the {used:,} before it are served from the cache, not computed again."
            + (
                " Past the context, the oldest messages no longer fit: start a new chat or "
                "branch from a recent message."
                if full
                else ""
            )
        )
