"""The memory panel: where the app's memory goes, now and over the last five minutes.

``MemoryPanel.update_stats(stats)`` takes the engine's ``EngineStats`` as the bridge hands
it over (no model and no cache before a model loads) and refreshes a grid of figures (MLX
active / cache / peak, process RSS, weights, the KV pool and the disk cache) and a time plot. It
is called a few times a second, so it stays cheap: one point per series per second at most (the
newest sample replaces a point younger than that), points older than the plotted window are
dropped, and the value axis is rescaled only when the data outgrows it or shrinks well below it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import TYPE_CHECKING

from PySide6.QtCharts import QLineSeries
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QFont, QPainter, QPalette, QPen
from PySide6.QtWidgets import QGridLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.charts import (
    BLUE,
    GREEN,
    ORANGE,
    PURPLE,
    RED,
    AxisPair,
    ChartPanel,
    chart_view,
    compact_chart,
)
from app.format import count, decimals_for, human_bytes, nice_step, percent
from core.paths import GB, MB

if TYPE_CHECKING:
    from core.engine.engine import EngineStats

_GB, _MB, _KB = GB, MB, 2**10

# what each figure means, in plain words (its caption's and its value's tooltip)
FIGURE_TIPS = {
    "mlxActive": "Memory MLX uses for what the model needs now: its weights, the KV pool "
    "and the step being computed.",
    "mlxCache": "Memory MLX has finished with but keeps, to reuse at once instead of asking "
    "the system again. It is handed back when memory runs short: it is not a leak.",
    "mlxPeak": "The most memory MLX has used at once since the model loaded.",
    "rss": "All the memory this app holds in RAM, as the system's activity monitor counts it: "
    "the model, the caches, the window.",
    "weights": "The model's weights in memory, as loaded (MLX's CPU backend holds them as "
    "float32, so a 4-bit model takes about 7 times its file size).",
    "poolCapacity": "The KV pool: memory set aside for the keys and values of prompt tokens, "
    "so a follow-up turn does not compute its history again. In tokens: how much "
    "conversation fits in RAM.",
    "poolUsed": "Pages of the pool holding tokens now: cached prompts and running requests.",
    "poolEvictable": "Cached prompts no request is using: kept for reuse, and the first to "
    "go when a new prompt needs room.",
    "poolLocked": "Pages a running request is using: they cannot be dropped until it ends.",
    "diskCache": "Chat prompts' keys and values saved on disk, so a chat reopened after a "
    "restart does not compute its history again. At its budget, the oldest go first.",
}


def nice_bytes_axis(top_bytes: float, intervals: int = 4) -> tuple[float, float, str, str]:
    """(axis top in bytes, axis top in display units, unit, label format) for an axis from 0
    that covers ``top_bytes`` in ``intervals`` round steps."""
    top_bytes = max(float(top_bytes), 1.0)
    unit, size = next(
        (
            (name, size)
            for name, size in (("GB", _GB), ("MB", _MB), ("KB", _KB))
            if top_bytes >= 0.75 * size
        ),
        ("B", 1),
    )  # "1.0 GB" rather than "2000 MB"
    step = nice_step(top_bytes / size, intervals)
    return step * intervals * size, step * intervals, unit, f"%.{decimals_for(step)}f {unit}"


# -- the pool bar --


class PoolBar(QWidget):
    """The KV pool as one thin bar: locked, evictable and other used pages out of all pages."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFixedHeight(8)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.pages = (0, 0, 0, 0)  # total, used, evictable, locked

    def set_pages(self, total: int, used: int, evictable: int, locked: int) -> None:
        pages = (total, used, evictable, locked)
        if pages != self.pages:
            self.pages = pages
            self.update()

    def paintEvent(self, event) -> None:
        total, used, evictable, locked = self.pages
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        track = QColor(self.palette().color(QPalette.ColorRole.WindowText))
        track.setAlpha(30)
        rect = QRectF(self.rect())
        painter.setBrush(track)
        painter.drawRoundedRect(rect, 3, 3)
        if total <= 0:
            return
        painter.setClipRect(rect)
        x = rect.left()
        locked = min(max(locked, 0), total)
        evictable = min(max(evictable, 0), total - locked)
        other = min(max(used - locked - evictable, 0), total - locked - evictable)
        for pages, colour in ((locked, RED), (evictable, GREEN), (other, ORANGE)):
            width = rect.width() * pages / total
            if width > 0:
                painter.setBrush(QColor(colour))
                painter.drawRect(QRectF(x, rect.top(), width, rect.height()))
                x += width


# -- the panel --


def _swatch(colour: str, text: str) -> str:
    return f'<span style="color:{colour}">&#9632;</span>&nbsp;{text}'


class MemoryPanel(ChartPanel):
    """Memory figures and their plot; feed it with ``update_stats``."""

    WINDOW_S = 300.0  # the plotted span
    # the newest point moves with each sample until it is this far from the one before
    MIN_SPACING_S = 1.0
    MAX_POINTS = 330  # per series, whatever the timing
    SERIES = (
        ("mlx_active", "MLX active", BLUE),
        ("mlx_cache", "MLX cache", ORANGE),
        # short: the legend is one line
        ("rss", "RSS", PURPLE),
        ("pool_used", "KV used", GREEN),
    )

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._origin: float | None = None  # the first sample's time: x = time - origin
        self._xs: deque[float] = deque()
        self._tops: deque[float] = deque()  # the largest of the series at each x
        self._y_top = 0.0  # the value axis's top, in bytes

        self.model_label = self._value("modelValue")
        self.model_label.setWordWrap(True)
        bold = QFont(self.model_label.font())
        bold.setBold(True)
        self.model_label.setFont(bold)
        self.cache_note = self._value("cacheNoteValue")
        self.cache_note.setWordWrap(True)
        self.cache_note.hide()

        figures = QGridLayout()
        figures.setHorizontalSpacing(10)
        figures.setVerticalSpacing(2)
        self.values: dict[str, QLabel] = {}
        for row, col, key, caption in (
            (0, 0, "mlxActive", "MLX active"),
            (1, 0, "mlxCache", "MLX cache"),
            (2, 0, "mlxPeak", "MLX peak"),
            (0, 2, "rss", "Process RSS"),
            (1, 2, "weights", "Weights"),
        ):
            figures.addWidget(self._caption(caption, key), row, col)
            figures.addWidget(self._add_value(key), row, col + 1)
        figures.setColumnStretch(1, 1)
        figures.setColumnStretch(3, 1)

        pool = QGridLayout()
        pool.setHorizontalSpacing(10)
        pool.setVerticalSpacing(2)
        self.pool_bar = PoolBar()
        self.pool_bar.setToolTip(
            "KV pool pages: locked (in use by running requests), evictable "
            "(cached, free to drop), other used (held by running requests only)"
        )
        rows = (
            ("poolCapacity", "KV pool"),
            ("poolUsed", _swatch(ORANGE, "Used")),
            ("poolEvictable", _swatch(GREEN, "Evictable")),
            ("poolLocked", _swatch(RED, "Locked")),
            ("diskCache", "Disk cache"),
        )
        self.pool_details: list[QWidget] = [self.pool_bar]  # hidden while the cache is off
        for row, (key, caption) in enumerate(rows):
            title, value = self._caption(caption, key), self._add_value(key)
            pool.addWidget(title, row + (row > 0), 0)
            pool.addWidget(value, row + (row > 0), 1)
            if key in ("poolUsed", "poolEvictable", "poolLocked"):
                self.pool_details += [title, value]
        pool.addWidget(self.pool_bar, 1, 0, 1, 2)
        pool.setColumnStretch(1, 1)

        self.chart = compact_chart()
        self.series: dict[str, QLineSeries] = {}
        for name, title, colour in self.SERIES:
            line = QLineSeries()
            line.setName(title)
            line.setPen(QPen(QColor(colour), 1.6))
            self.chart.addSeries(line)
            self.series[name] = line
        self.x_axis = AxisPair(self.chart, Qt.AlignmentFlag.AlignBottom, self.series.values())
        self.y_axis = AxisPair(self.chart, Qt.AlignmentFlag.AlignLeft, self.series.values())
        minutes = self.WINDOW_S / 60
        self.x_axis.shown.setLabelFormat("%.0fm")
        self.x_axis.shown.setTickCount(int(minutes) + 1)
        self.x_axis.set_range(-self.WINDOW_S, 0, -minutes, 0)
        self.y_axis.shown.setTickCount(5)
        self._set_y_top(0)
        self.chart_view = chart_view(self.chart)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 4)
        layout.setSpacing(6)
        layout.addWidget(self.model_label)
        layout.addWidget(self.cache_note)
        layout.addLayout(figures)
        layout.addLayout(pool)
        layout.addWidget(self.chart_view, 1)
        self._restyle()
        self.model_label.setText("No model loaded")

    # -- the one slot --

    def update_stats(self, stats: EngineStats, now: float | None = None) -> None:
        """Show one snapshot of the engine's figures (see the module docstring), taken at
        ``now`` (``time.monotonic()`` seconds; default: now)."""
        model, cache = stats.model, stats.cache
        name, running = (model.name if model is not None else ""), stats.requests_running
        status = "idle" if not running else f"{running} request{'s' if running > 1 else ''} running"
        self.model_label.setText(f"{name} · {status}" if name else "No model loaded")
        reason = cache.disabled_reason if cache is not None else None
        off = cache is None or not cache.enabled or bool(reason)
        self.cache_note.setText(f"KV cache off: {reason}" if reason else "KV cache off")
        self.cache_note.setVisible(off and bool(name))

        # a zero before any model is unknown, not none
        def before_a_model(value: int) -> int | None:
            return value if value or model is not None else None

        for key, value in (
            ("mlxActive", before_a_model(stats.mlx_active_bytes)),
            ("mlxCache", before_a_model(stats.mlx_cache_bytes)),
            ("mlxPeak", before_a_model(stats.mlx_peak_bytes)),
            ("rss", stats.rss_bytes),
            ("weights", model.weight_bytes if model is not None else None),
        ):
            self.values[key].setText(self._bytes(value))

        page_size, total = (cache.page_size, cache.pages_total) if cache is not None else (0, 0)
        used, evictable, locked = (
            (cache.pages_used, cache.pages_evictable, cache.pages_locked)
            if cache is not None
            else (0, 0, 0)
        )
        pool_bytes = cache.pool_bytes if cache is not None else 0
        pool_budget = cache.pool_budget_bytes if cache is not None else 0
        if total > 0:
            reserved = (
                f"{human_bytes(pool_bytes)} of {human_bytes(pool_budget)} reserved"
                if pool_budget > pool_bytes
                else human_bytes(pool_bytes)
            )
            self.values["poolCapacity"].setText(f"{reserved} · {count(total * page_size)} tokens")
            for key, pages in (
                ("poolUsed", used),
                ("poolEvictable", evictable),
                ("poolLocked", locked),
            ):
                self.values[key].setText(
                    f"{count(pages * page_size)} tokens · {percent(pages / total)}"
                )
        else:
            for key in ("poolCapacity", "poolUsed", "poolEvictable", "poolLocked"):
                self.values[key].setText("off" if off and name else "—")
        self.pool_bar.set_pages(total, used, evictable, locked)
        show_details = not (off and name)
        if self.pool_bar.isVisibleTo(self) != show_details:
            for widget in self.pool_details:
                widget.setVisible(show_details)

        disk, budget = stats.disk_cache_bytes, stats.disk_cache_budget_bytes
        if budget > 0:
            written = stats.disk.bytes_written if stats.disk is not None else 0
            stopped = stats.disk.writes_stopped if stats.disk is not None else None
            self.values["diskCache"].setText(
                f"{human_bytes(disk)} of {human_bytes(budget)} · {percent(disk / budget)}"
                + (f" · {human_bytes(written)} written" if written else "")
                + (" · writes stopped (disk full)" if stopped else "")
            )
            made = getattr(stats, "derived_bytes", 0)
            self.values["diskCache"].setToolTip(
                FIGURE_TIPS["diskCache"]
                + "\n\n"
                + (str(stopped) if stopped else "“written”: bytes written since the model loaded")
                + (
                    f"\n\nThe budget counts {human_bytes(made)} of files made from models at "
                    "load (tokenizers, kept conversions): Model… › Delete Derived Files"
                    if made
                    else ""
                )
            )
        else:
            self.values["diskCache"].setText("off" if name else "—")

        self.set_summary(
            " · ".join(
                part
                for part in (
                    "" if name else "No model",
                    f"RSS {human_bytes(stats.rss_bytes)}" if stats.rss_bytes else "",
                    f"MLX {human_bytes(stats.mlx_active_bytes)}" if model is not None else "",
                    f"KV {percent(used / total)} used" if total > 0 else "",
                )
                if part
            )
        )
        self._plot(
            float(now) if now is not None else time.monotonic(),
            {
                "mlx_active": float(stats.mlx_active_bytes),
                "mlx_cache": float(stats.mlx_cache_bytes),
                "rss": float(stats.rss_bytes),
                "pool_used": (pool_budget or pool_bytes) * used / total if total > 0 else 0.0,
            },
        )

    # -- for tests and callers --

    def series_points(self, name: str) -> int:
        return self.series[name].count()

    def value_text(self, key: str) -> str:
        """A figure as shown; ``key`` as in the objectNames without "Value" ("rss", "poolUsed")."""
        return self.values[key].text()

    # -- helpers --

    def _plot(self, now: float, values: dict[str, float]) -> None:
        if self._origin is None or (self._xs and now < self._origin + self._xs[-1]):
            self._clear_plot(now)  # the first sample, or a clock that went back
        x = now - self._origin
        top = max(values.values())
        if len(self._xs) >= 2 and self._xs[-1] - self._xs[-2] < self.MIN_SPACING_S:
            for name, line in self.series.items():  # the newest point moves along with the clock
                line.replace(line.count() - 1, x, values[name])
            self._xs[-1], self._tops[-1] = x, top
        else:
            for name, line in self.series.items():
                line.append(x, values[name])
            self._xs.append(x)
            self._tops.append(top)
        drop = 0
        while len(self._xs) - drop > self.MAX_POINTS or (
            len(self._xs) - drop >= 2 and self._xs[drop + 1] <= x - self.WINDOW_S
        ):
            drop += 1  # keep one point left of the window, so the line reaches its edge
        if drop:
            for _ in range(drop):
                self._xs.popleft()
                self._tops.popleft()
            for line in self.series.values():
                line.removePoints(0, drop)
        self._set_x_span(x)
        peak = max(self._tops)
        if peak > self._y_top or peak < 0.35 * self._y_top:
            self._set_y_top(peak)

    def _set_x_span(self, x: float) -> None:
        """Show the last ``WINDOW_S`` seconds; until then, what was recorded, rounded up to
        whole minutes (so a fresh start doesn't plot a sliver at the right edge)."""
        span = min(self.WINDOW_S, 60.0 * math.ceil(max(x, 1.0) / 60.0))
        if span < 180:
            self.x_axis.shown.setLabelFormat("%.0fs")
            self.x_axis.shown.setTickCount(5)
            self.x_axis.set_range(x - span, x, -span, 0)
        else:
            self.x_axis.shown.setLabelFormat("%.0fm")
            self.x_axis.shown.setTickCount(int(span // 60) + 1)
            self.x_axis.set_range(x - span, x, -span / 60, 0)

    def _clear_plot(self, now: float) -> None:
        self._origin = now
        self._xs.clear()
        self._tops.clear()
        for line in self.series.values():
            line.clear()

    def _set_y_top(self, peak: float) -> None:
        top_bytes, top_shown, _unit, label_format = nice_bytes_axis(peak)
        self._y_top = top_bytes
        self.y_axis.shown.setLabelFormat(label_format)
        self.y_axis.set_range(0, top_bytes, 0, top_shown)

    @staticmethod
    def _bytes(value) -> str:
        return "—" if value is None else human_bytes(value)

    def _value(self, name: str) -> QLabel:
        label = QLabel("—")
        label.setObjectName(name)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        return label

    def _add_value(self, key: str) -> QLabel:
        label = self._value(f"{key}Value")
        label.setToolTip(FIGURE_TIPS[key])
        self.values[key] = label
        return label

    def _caption(self, text: str, key: str) -> QLabel:
        label = QLabel(text)
        label.setToolTip(FIGURE_TIPS[key])
        label.setTextFormat(Qt.TextFormat.RichText if "<" in text else Qt.TextFormat.PlainText)
        # captions recede, figures stand out
        label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        return label
