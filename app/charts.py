"""The compact chart look the two live panels share: series colours, small fonts, tight
margins, transparent backgrounds that follow the palette, and paired value axes."""

from __future__ import annotations

from PySide6.QtCharts import QChart, QChartView, QValueAxis
from PySide6.QtCore import QEvent, QMargins, Qt, Signal
from PySide6.QtGui import QColor, QFont, QPainter, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

# Mid-luminance colours that read on light and dark backgrounds alike.
BLUE, ORANGE, GREEN, PURPLE, RED = "#4C9BE8", "#F2A33A", "#3FB68B", "#B07AA1", "#E8684A"


def small_font(widget: QWidget) -> QFont:
    """The widget's font, a size or so smaller: for axes, legends and captions."""
    font = QFont(widget.font())
    size = font.pointSizeF()
    if size > 0:
        font.setPointSizeF(max(7.0, size - 1.5))
    return font


def compact_chart() -> QChart:
    """A chart without a frame, background, animation or spare margins; legend at the bottom."""
    chart = QChart()
    chart.setAnimationOptions(QChart.AnimationOption.NoAnimation)
    chart.setBackgroundVisible(False)
    chart.setBackgroundRoundness(0)
    chart.setMargins(QMargins(0, 0, 0, 0))
    chart.layout().setContentsMargins(0, 0, 0, 0)
    legend = chart.legend()
    legend.setAlignment(Qt.AlignmentFlag.AlignBottom)
    legend.setMarkerShape(legend.MarkerShape.MarkerShapeRectangle)
    return chart


def chart_view(chart: QChart) -> QChartView:
    view = QChartView(chart)
    view.setRenderHint(QPainter.RenderHint.Antialiasing)
    view.setFrameShape(QChartView.Shape.NoFrame)
    view.setStyleSheet("background: transparent")
    view.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
    view.setMinimumHeight(140)
    return view


def style_chart(chart: QChart, palette: QPalette, font: QFont) -> None:
    """Axis labels, grid and legend in the palette's text colour (light or dark mode)."""
    text = palette.color(QPalette.ColorRole.WindowText)
    grid, line = QColor(text), QColor(text)
    grid.setAlpha(35)
    line.setAlpha(110)
    for axis in chart.axes():
        axis.setLabelsFont(font)
        axis.setLabelsColor(text)
        axis.setTitleBrush(text)
        axis.setTitleFont(font)
        axis.setGridLineColor(grid)
        axis.setLinePen(QPen(line, 1))
    chart.legend().setFont(font)
    chart.legend().setLabelColor(text)


class AxisPair:
    """Two value axes on one side of a chart: ``data``, hidden, which the series plot on (in
    raw units), and ``shown``, which the reader sees (in display units: GB, minutes ago,
    thousands). Both span the same length of the chart, so the shown ticks line up with the
    data; only the labels differ."""

    def __init__(self, chart: QChart, alignment: Qt.AlignmentFlag, series=()):
        self.data, self.shown = QValueAxis(), QValueAxis()
        chart.addAxis(self.data, alignment)
        chart.addAxis(self.shown, alignment)
        self.data.setVisible(False)
        self.shown.setTruncateLabels(False)  # "200 MB", not "200..."
        for one in series:
            one.attachAxis(self.data)

    def set_range(self, data_lo: float, data_hi: float, shown_lo: float, shown_hi: float) -> None:
        self.data.setRange(data_lo, data_hi)
        self.shown.setRange(shown_lo, shown_hi)


class ChartPanel(QWidget):
    """A panel with one chart (``self.chart``) restyled when the palette or font changes, and
    its main figures in one line (``summary``, for when the panel is folded)."""

    chart: QChart
    summaryChanged = Signal(str)
    summary = ""

    def set_summary(self, text: str) -> None:
        if text != self.summary:
            self.summary = text
            self.summaryChanged.emit(text)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.FontChange):
            self._restyle()
        super().changeEvent(event)

    def _restyle(self) -> None:
        style_chart(self.chart, self.palette(), small_font(self))
