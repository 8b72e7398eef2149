"""The cache panel: how much of each prompt the cache served, turn by turn.

Per turn (the engine's ``RequestStats``, or the dict the chat store keeps of one): the prompt
split into tokens served from the RAM cache (``cached_tokens``), restored from the disk cache
(``restored_tokens``) and computed by the model (``computed_tokens``); the three add up to
``prompt_tokens`` for a turn that reached its first token. The panel plots the last turns as
stacked bars with the time to first token on a second axis, and shows the last turn's split, the
session's hit rate, and the app's hit rate and evictions since start (``update_totals``). It
names the cache namespace that served the last turn (``cache_namespace``: the app's chats share
prefixes among themselves only, never with API clients) and how many namespaces the RAM cache
holds now.

Slots: ``set_turns`` (the session changed), ``add_turn`` (a turn finished),
``update_totals`` (the engine's ``EngineStats``, as the memory panel gets them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtCharts import QBarSet, QLineSeries, QStackedBarSeries, QValueAxis
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QColor, QCursor, QPalette, QPen
from PySide6.QtWidgets import QGridLayout, QLabel, QStackedWidget, QToolTip, QVBoxLayout, QWidget

from app.charts import BLUE, GREEN, ORANGE, PURPLE, AxisPair, ChartPanel, chart_view, compact_chart
from app.format import count, decimals_for, duration, nice_step, percent
from core.engine.types import RequestStats

if TYPE_CHECKING:
    from core.engine.engine import EngineStats


# what each figure means, in plain words (its caption's and its value's tooltip)
FIGURE_TIPS = {
    "lastTurn": "The last reply's prompt, split by where its tokens came from: the RAM cache "
    "(already in memory), the disk cache (saved by an earlier session) or computed by the "
    "model now. The more the cache serves, the sooner the reply starts.",
    "ttft": "How long the last reply took to start: reading the prompt (what the cache did "
    "not serve) and the first token.",
    "sessionHitRate": "The share of this chat's prompt tokens the cache served, so the model "
    "did not compute them again.",
    "appHitRate": "The same share over every request since the app started: chats and API.",
    "evictions": "Cached prompt tokens dropped from RAM since the app started, to make room "
    "for newer ones. A prompt that needs them again reads them from disk or computes them; "
    "many evictions mean the KV pool is small for the chats you keep going.",
    "cachedAs": "How this model's prompts are kept for reuse: KV pages (attention layers' "
    "keys and values) and, for sliding-window or recurrent layers, snapshots of their state.",
    "kvFormat": "How the cached keys and values are stored, per kind of layer: at the "
    "model's own precision, or quantized to 8 or 4 bits (Preferences → KV precision), which "
    "holds about 2 to 4 times the tokens in the same memory and on disk. Sliding-window and "
    "recurrent layers keep their own format.",
    "namespace": "Whose cached prompts the last turn could reuse: the app's chats share among "
    "themselves; each API key (and each cache_salt) has its own, so no client sees "
    "another's prompts. “in RAM”: how many such groups the RAM cache holds now.",
}


@dataclass(frozen=True)
class TurnSplit:
    """One turn's prompt tokens by source, each >= 0; ``prompt`` is at least their sum."""

    ram: int
    disk: int
    computed: int
    prompt: int
    ttft_s: float
    # the cache namespace the prompt was looked up in (a label; "" before namespaces)
    namespace: str = ""

    @classmethod
    def of(cls, stats: RequestStats | dict) -> TurnSplit:
        """From a reply's RequestStats, or a stored turn's dict of one (keys may be missing or
        odd)."""
        if isinstance(stats, RequestStats):
            stats = dataclasses.asdict(stats)
        ram, disk, computed = (
            max(0, int(stats.get(key) or 0))
            for key in ("cached_tokens", "restored_tokens", "computed_tokens")
        )
        prompt = max(int(stats.get("prompt_tokens") or 0), ram + disk + computed)
        namespace = stats.get("cache_namespace")
        return cls(
            ram,
            disk,
            computed,
            prompt,
            max(0.0, float(stats.get("ttft_s") or 0.0)),
            namespace if isinstance(namespace, str) else "",
        )

    @property
    def hit(self) -> int:
        return self.ram + self.disk

    def describe(self) -> str:
        where = f" (namespace {self.namespace})" if self.namespace and self.hit else ""
        return (
            f"{count(self.prompt)} prompt tokens: {count(self.ram)} RAM · {count(self.disk)} disk"
            f" · {count(self.computed)} computed{where}"
        )


CACHED_AS = {
    "pages": "KV pages",
    "snapshots": "state snapshots (no full-attention layer)",
    "pages+snapshots": "KV pages + state snapshots",
}


def cached_as_text(cache) -> str:
    """How the loaded model's prefixes are cached, in words (``cache``: the engine's
    CacheStats, None without a model)."""
    if cache is None:
        return "—"
    if not cache.enabled:
        return f"off: {cache.disabled_reason}" if cache.disabled_reason else "off"
    return CACHED_AS.get(cache.cached_as, cache.cached_as or "—")


KIND_NAMES = {"full": "attention", "sliding": "sliding window", "auxiliary": "recurrent"}


def kv_format_text(cache) -> str:
    """The KV format per layer kind, one line each ("attention: 8-bit (group 64)"); "—"
    without a model or a cache."""
    if cache is None or not cache.enabled or not cache.kv_formats:
        return "—"
    return "\n".join(f"{KIND_NAMES.get(kind, kind)}: {fmt}" for kind, fmt in cache.kv_formats)


def hit_rate(turns: list[TurnSplit]) -> tuple[float, int]:
    """(cached + restored) / prompt tokens, summed over ``turns``, and that prompt total."""
    hit, prompt = sum(t.hit for t in turns), sum(t.prompt for t in turns)
    return (hit / prompt if prompt else 0.0), prompt


class CachePanel(ChartPanel):
    """Per-turn prompt split and TTFT, with the session's and the app's hit rates."""

    MAX_BARS = 20  # turns plotted
    MIN_SLOTS = 8  # the x axis spans at least this many turns, so a first bar is not a slab

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.turns: list[TurnSplit] = []  # the session's, oldest first

        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(2)
        self.values: dict[str, QLabel] = {}
        for row, (key, caption) in enumerate(
            (
                ("lastTurn", "Last turn"),
                ("ttft", "First token"),
                ("sessionHitRate", "Session hits"),
                ("appHitRate", "App hits"),
                ("evictions", "Evictions"),
                ("namespace", "Namespace"),
                ("cachedAs", "Cached as"),
                ("kvFormat", "KV format"),
            )
        ):
            title = QLabel(caption)
            title.setForegroundRole(QPalette.ColorRole.PlaceholderText)
            title.setToolTip(FIGURE_TIPS[key])
            value = QLabel("—")
            value.setToolTip(FIGURE_TIPS[key])
            value.setObjectName(f"{key}Value")
            value.setWordWrap(True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.values[key] = value
            grid.addWidget(title, row, 0, Qt.AlignmentFlag.AlignTop)
            grid.addWidget(value, row, 1)
        grid.setColumnStretch(1, 1)
        self._namespaces_in_ram: int | None = None

        self.ram_set, self.disk_set, self.computed_set = (
            self._bar_set(title, colour)
            for title, colour in (("RAM hit", GREEN), ("Disk restore", BLUE), ("Computed", ORANGE))
        )
        self.bars = QStackedBarSeries()
        self.bars.setBarWidth(0.7)
        for bar_set in (self.ram_set, self.disk_set, self.computed_set):
            self.bars.append(bar_set)
        self.bars.hovered.connect(self._on_bar_hovered)
        self.ttft_series = QLineSeries()
        self.ttft_series.setName("TTFT")
        self.ttft_series.setPen(QPen(QColor(PURPLE), 1.6))
        self.ttft_series.setPointsVisible(True)
        self.ttft_series.setMarkerSize(5)

        self.chart = compact_chart()
        self.chart.addSeries(self.bars)
        self.chart.addSeries(self.ttft_series)
        both = (self.bars, self.ttft_series)
        self.x_axis = AxisPair(self.chart, Qt.AlignmentFlag.AlignBottom, both)  # data: bar index
        self.x_axis.shown.setTickType(QValueAxis.TickType.TicksDynamic)  # shown: turn numbers
        self.x_axis.shown.setTickAnchor(0)
        self.x_axis.shown.setLabelFormat("%.0f")
        self.x_axis.shown.setGridLineVisible(False)
        self.tokens_axis = AxisPair(self.chart, Qt.AlignmentFlag.AlignLeft, (self.bars,))
        self.tokens_axis.shown.setTickCount(5)
        # s; s or ms
        self.ttft_axis = AxisPair(self.chart, Qt.AlignmentFlag.AlignRight, (self.ttft_series,))
        self.ttft_axis.shown.setTickCount(5)
        self.ttft_axis.shown.setGridLineVisible(False)
        self.chart_view = chart_view(self.chart)

        self.empty_label = QLabel(
            "No turns yet in this chat.\nEach reply's prompt will show here, split "
            "into tokens served from the RAM cache, restored from disk, and computed."
        )
        self.empty_label.setObjectName("emptyState")
        self.empty_label.setWordWrap(True)
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.plot_stack = QStackedWidget()
        self.plot_stack.addWidget(self.empty_label)
        self.plot_stack.addWidget(self.chart_view)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 4)
        layout.setSpacing(6)
        layout.addLayout(grid)
        layout.addWidget(self.plot_stack, 1)
        self._restyle()
        self._refresh()

    # -- slots --

    def set_turns(self, turns: list[RequestStats | dict]) -> None:
        """Replace the history with another session's turns (oldest first)."""
        self.turns = [TurnSplit.of(turn) for turn in turns]
        self._refresh()

    def add_turn(self, stats: RequestStats | dict) -> None:
        """One finished turn of the current session."""
        self.turns.append(TurnSplit.of(stats))
        self._refresh()

    def update_totals(self, stats: EngineStats) -> None:
        """The app's figures since start, from the engine's cache figures (none: no cache):
        hit rate, hit tokens, prompt tokens seen, evicted pages and tokens."""
        cache = stats.cache
        seen, hit = (cache.prompt_tokens, cache.hit_tokens) if cache is not None else (0, 0)
        rate = cache.hit_rate if cache is not None else 0.0
        self.values["appHitRate"].setText(
            f"{percent(rate)} of {count(seen)} tokens" if seen else "—"
        )
        self.values["appHitRate"].setToolTip(
            FIGURE_TIPS["appHitRate"]
            + (
                f"\n\n{count(hit)} of {count(seen)} prompt tokens served from the cache"
                if seen
                else ""
            )
        )
        pages, tokens = (cache.evicted_pages, cache.evicted_tokens) if cache is not None else (0, 0)
        self.values["evictions"].setText(
            f"{count(tokens)} tokens ({count(pages)} pages)" if pages or tokens else "none"
        )
        self.values["cachedAs"].setText(cached_as_text(cache))
        layout = f"\n\n{cache.layout}" if cache is not None and cache.layout else ""
        self.values["cachedAs"].setToolTip(FIGURE_TIPS["cachedAs"] + layout)
        self.values["kvFormat"].setText(kv_format_text(cache))
        namespaces = cache.namespaces if cache is not None else None
        if namespaces != self._namespaces_in_ram:
            self._namespaces_in_ram = namespaces
            self._show_namespace()

    # -- for tests and callers --

    def value_text(self, key: str) -> str:
        """A figure as shown; ``key`` as in the objectNames without "Value" ("ttft")."""
        return self.values[key].text()

    @property
    def plotted_turns(self) -> list[TurnSplit]:
        return self.turns[-self.MAX_BARS :]

    # -- helpers --

    def _refresh(self) -> None:
        shown = self.plotted_turns
        self.plot_stack.setCurrentWidget(self.chart_view if shown else self.empty_label)
        if not shown:
            for key in ("lastTurn", "ttft", "sessionHitRate"):
                self.values[key].setText("—")
            self.set_summary("No turns yet in this chat")
        else:
            last = shown[-1]
            self.values["lastTurn"].setText(last.describe())
            self.values["ttft"].setText(duration(last.ttft_s))
            rate, prompt = hit_rate(self.turns)
            turns = len(self.turns)
            self.values["sessionHitRate"].setText(
                f"{percent(rate)} of {count(prompt)} tokens · {count(turns)} "
                f"turn{'s' if turns != 1 else ''}"
            )
            served = last.hit / last.prompt if last.prompt else 0.0
            self.set_summary(
                f"Last turn {percent(served)} cached · first token {duration(last.ttft_s)}"
            )
        self._show_namespace()

        for bar_set, field in (
            (self.ram_set, "ram"),
            (self.disk_set, "disk"),
            (self.computed_set, "computed"),
        ):
            bar_set.remove(0, bar_set.count())
            bar_set.append([float(getattr(turn, field)) for turn in shown])
        self.ttft_series.replace([QPointF(i, turn.ttft_s) for i, turn in enumerate(shown)])

        slots = max(len(shown), self.MIN_SLOTS)
        first = len(self.turns) - len(shown) + 1  # the first plotted turn's number
        self.x_axis.set_range(-0.5, slots - 0.5, first - 0.5, first + slots - 0.5)
        self.x_axis.shown.setTickInterval(1 if slots <= 10 else 2 if slots <= 16 else 5)

        tokens_top = max((turn.prompt for turn in shown), default=0)
        step = nice_step(max(tokens_top, 1), 4)
        scale, suffix = (1000, "k") if step * 4 >= 10_000 else (1, "")
        self.tokens_axis.shown.setLabelFormat(f"%.{decimals_for(step / scale)}f{suffix}")
        self.tokens_axis.set_range(0, step * 4, 0, step * 4 / scale)

        # headroom, so the line's points stay clear of the top edge
        ttft_step = nice_step(1.2 * max((turn.ttft_s for turn in shown), default=0) or 0.1, 4)
        scale, unit = (0.001, "ms") if ttft_step * 4 < 1 else (1, "s")
        self.ttft_axis.shown.setLabelFormat(f"%.{decimals_for(ttft_step / scale)}f {unit}")
        self.ttft_axis.set_range(0, ttft_step * 4, 0, ttft_step * 4 / scale)

    def _show_namespace(self) -> None:
        shown = self.turns[-1].namespace if self.turns and self.turns[-1].namespace else "—"
        held = self._namespaces_in_ram
        if held:
            shown += f" · {count(held)} in RAM"
        self.values["namespace"].setText(shown)

    def _bar_set(self, title: str, colour: str) -> QBarSet:
        bar_set = QBarSet(title)
        bar_set.setColor(QColor(colour))
        bar_set.setBorderColor(QColor(colour))
        return bar_set

    def _on_bar_hovered(self, inside: bool, index: int, _bar_set: QBarSet) -> None:
        shown = self.plotted_turns
        if not inside or not 0 <= index < len(shown):
            QToolTip.hideText()
            return
        turn, number = shown[index], len(self.turns) - len(shown) + index + 1
        QToolTip.showText(
            QCursor.pos(),
            f"Turn {number}: {turn.describe()}\nFirst token after {duration(turn.ttft_s)}",
            self.chart_view,
        )
