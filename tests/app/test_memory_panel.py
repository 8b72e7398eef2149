"""The memory panel fed with the engine's EngineStats, and the number formatting it shares."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import dataclasses  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtWidgets import QLabel  # noqa: E402

from app.format import count, decimals_for, duration, human_bytes, nice_step, percent  # noqa: E402
from app.memory_panel import MemoryPanel, nice_bytes_axis  # noqa: E402
from core.engine.engine import EngineStats  # noqa: E402
from core.models.load.loader import ModelInfo  # noqa: E402
from kvcache.stats import CacheStats, DiskTierStats  # noqa: E402

GB, MB = 2**30, 2**20


def loaded(**changes) -> tuple[EngineStats, float]:
    """A snapshot of a loaded model with the cache on (1024 pages of 16 tokens), and its time:
    the arguments of ``update_stats``."""
    stats = dict(
        time=100.0,
        mlx_active_bytes=int(1.5 * GB),
        mlx_cache_bytes=300 * MB,
        mlx_peak_bytes=2 * GB,
        rss_bytes=int(2.4 * GB),
        weight_bytes=270 * MB,
        model_name="SmolLM2-135M",
        cache_enabled=True,
        cache_disabled_reason=None,
        page_size=16,
        pages_total=1024,
        pages_used=256,
        pages_evictable=192,
        pages_locked=32,
        pool_bytes=512 * MB,
        disk_cache_bytes=256 * MB,
        disk_cache_budget_bytes=10 * GB,
        requests_running=1,
    )
    stats.update(changes)
    now = stats.pop("time")
    model = ModelInfo(
        spec="default",
        name=stats.pop("model_name"),
        path="/models/smollm2",
        model_type="llama",
        fingerprint="0" * 16,
        weights_format="float32",
        weight_bytes=stats.pop("weight_bytes"),
        context_length=8192,
        num_layers=30,
        load_seconds=1.0,
    )
    cache = {f.name: 0 for f in dataclasses.fields(CacheStats)}
    cache.update(
        enabled=stats.pop("cache_enabled"),
        disabled_reason=stats.pop("cache_disabled_reason"),
        **{
            name: stats.pop(name)
            for name in (
                "page_size",
                "pages_total",
                "pages_used",
                "pages_evictable",
                "pages_locked",
                "pool_bytes",
            )
        },
    )
    return EngineStats(model=model, cache=CacheStats(**cache), **stats), now


def tier_stats(**changes) -> DiskTierStats:
    figures = {f.name: 0 for f in dataclasses.fields(DiskTierStats)}
    figures["writes_stopped"] = None
    return DiskTierStats(**{**figures, **changes})


@pytest.fixture
def panel(qtbot):
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    panel.resize(360, 520)
    panel.show()
    return panel


def text(panel: MemoryPanel, name: str) -> str:
    label = panel.findChild(QLabel, name)
    assert label is not None, name
    return label.text()


def test_formatting():
    assert [
        human_bytes(n) for n in (0, 512, 1536, 300 * MB, int(1.5 * GB), 1000 * 1024, 10 * GB, None)
    ] == ["0 B", "512 B", "1.5 KB", "300 MB", "1.5 GB", "1.0 MB", "10.0 GB", "0 B"]
    assert human_bytes(123.4 * GB) == "123 GB" and human_bytes(-2048) == "-2.0 KB"
    assert [percent(x) for x in (0, 0.25, 0.423, 1, 0.001, 0.999, None)] == [
        "0%",
        "25%",
        "42%",
        "100%",
        "<1%",
        ">99%",
        "0%",
    ]
    assert percent(0.4237, 1) == "42.4%"
    assert count(12345) == "12,345" and count(None) == "0"
    assert [duration(s) for s in (0.0421, 1.234, 12.34, 75, 120)] == [
        "42 ms",
        "1.23 s",
        "12.3 s",
        "1 min 15 s",
        "2 min",
    ]
    assert [nice_step(x) for x in (4, 3.3, 1, 9, 0.3, 0)] == [1, 1, 0.25, 2.5, 0.1, 1]
    assert [decimals_for(s) for s in (1, 0.5, 0.25, 2.5, 100)] == [0, 1, 2, 1, 0]


def test_bytes_axis_picks_a_unit_and_round_ticks():
    assert nice_bytes_axis(3.3 * GB) == (4 * GB, 4, "GB", "%.0f GB")
    assert nice_bytes_axis(1003 * MB)[1:] == (1.0, "GB", "%.2f GB")  # not "2000 MB"
    assert nice_bytes_axis(300 * MB) == (400 * MB, 400, "MB", "%.0f MB")
    assert nice_bytes_axis(0)[0] > 0


def test_figures_show_the_snapshot(panel):
    panel.update_stats(*loaded())
    assert text(panel, "modelValue") == "SmolLM2-135M · 1 request running"
    assert text(panel, "mlxActiveValue") == "1.5 GB"
    assert text(panel, "mlxCacheValue") == "300 MB"
    assert text(panel, "mlxPeakValue") == "2.0 GB"
    assert text(panel, "rssValue") == "2.4 GB"
    assert text(panel, "weightsValue") == "270 MB"
    assert text(panel, "poolCapacityValue") == "512 MB · 16,384 tokens"
    assert text(panel, "poolUsedValue") == "4,096 tokens · 25%"
    assert text(panel, "poolEvictableValue") == "3,072 tokens · 19%"
    assert text(panel, "poolLockedValue") == "512 tokens · 3%"
    assert text(panel, "diskCacheValue") == "256 MB of 10.0 GB · 2%"
    assert not panel.findChild(QLabel, "cacheNoteValue").isVisible()
    assert panel.pool_bar.pages == (1024, 256, 192, 32)
    pool_used = panel.series["pool_used"]
    assert pool_used.at(0).y() == 128 * MB  # a quarter of the pool's bytes
    assert panel.series["rss"].at(0).y() == int(2.4 * GB)

    panel.update_stats(*loaded(time=101.0, disk=tier_stats(bytes_written=12 * MB)))
    assert text(panel, "diskCacheValue") == "256 MB of 10.0 GB · 2% · 12.0 MB written"
    panel.update_stats(
        *loaded(
            time=101.5, disk=tier_stats(bytes_written=12 * MB, writes_stopped="the disk is full")
        )
    )
    assert (
        text(panel, "diskCacheValue")
        == "256 MB of 10.0 GB · 2% · 12.0 MB written · writes stopped (disk full)"
    )
    panel.update_stats(*loaded(time=102.0, requests_running=0, disk_cache_budget_bytes=0))
    assert text(panel, "modelValue") == "SmolLM2-135M · idle"
    assert text(panel, "diskCacheValue") == "off"


def test_missing_keys_before_a_model_loads(panel):
    panel.update_stats(EngineStats())
    panel.update_stats(EngineStats(rss_bytes=150 * MB), 5.0)
    assert text(panel, "modelValue") == "No model loaded"
    assert text(panel, "rssValue") == "150 MB"
    for name in (
        "mlxActiveValue",
        "weightsValue",
        "poolCapacityValue",
        "poolUsedValue",
        "diskCacheValue",
    ):
        assert text(panel, name) == "—"
    panel.update_stats(*loaded(pages_total=0, page_size=0, pool_bytes=0, mlx_active_bytes=0))
    assert text(panel, "mlxActiveValue") == "0 B" and text(panel, "poolUsedValue") == "—"
    assert all(panel.series_points(name) >= 1 for name in panel.series)


def test_a_disabled_cache_says_why(panel):
    panel.update_stats(
        *loaded(
            cache_enabled=False,
            cache_disabled_reason="not enough memory for the KV pool",
            pages_total=0,
            pool_bytes=0,
        )
    )
    note = panel.findChild(QLabel, "cacheNoteValue")
    assert note.isVisible() and note.text() == "KV cache off: not enough memory for the KV pool"
    assert text(panel, "poolCapacityValue") == "off"
    assert (
        not panel.findChild(QLabel, "poolUsedValue").isVisible() and not panel.pool_bar.isVisible()
    )
    panel.update_stats(*loaded())  # another model, with the cache on
    assert not note.isVisible() and panel.findChild(QLabel, "poolUsedValue").isVisible()


def test_points_are_capped_and_span_the_window(panel):
    for i in range(2000):  # 8 minutes at 4 updates a second
        panel.update_stats(*loaded(time=1000.0 + i * 0.25, mlx_active_bytes=i))
    last_x = panel.series["mlx_active"].at(panel.series_points("mlx_active") - 1).x()
    first_x = panel.series["mlx_active"].at(0).x()
    for name in panel.series:
        assert panel.series_points(name) <= MemoryPanel.MAX_POINTS
    # just left of the window
    assert last_x - MemoryPanel.WINDOW_S - 2 <= first_x <= last_x - MemoryPanel.WINDOW_S
    # the newest sample
    assert panel.series["mlx_active"].at(panel.series_points("mlx_active") - 1).y() == 1999
    assert (
        panel.x_axis.data.max() == last_x
        and panel.x_axis.data.min() == last_x - MemoryPanel.WINDOW_S
    )


def test_idle_updates_each_add_a_point(panel):
    for i in range(10):
        panel.update_stats(*loaded(time=50.0 + i * 1.5))
    assert panel.series_points("rss") == 10
    panel.update_stats(*loaded(time=64.0))  # 0.5 s after the last: a new point, which then moves
    panel.update_stats(*loaded(time=64.2, rss_bytes=3 * GB))
    assert panel.series_points("rss") == 11
    assert (
        panel.series["rss"].at(10).x() == pytest.approx(14.2)
        and panel.series["rss"].at(10).y() == 3 * GB
    )


def test_the_value_axis_follows_the_data(panel):
    panel.update_stats(*loaded(time=0.0, rss_bytes=3 * GB))
    assert (panel.y_axis.shown.max(), panel.y_axis.shown.labelFormat()) == (4, "%.0f GB")
    assert panel.y_axis.data.max() == 4 * GB
    for i in range(1, 400):  # the 3 GB sample leaves the window; nothing else tops 300 MB
        panel.update_stats(
            *loaded(time=float(i), rss_bytes=300 * MB, mlx_active_bytes=100 * MB, mlx_cache_bytes=0)
        )
    assert (panel.y_axis.shown.max(), panel.y_axis.shown.labelFormat()) == (400, "%.0f MB")
    assert panel.y_axis.data.max() == 400 * MB
    # outgrown: rescaled at once
    panel.update_stats(*loaded(time=400.0, rss_bytes=300 * MB, mlx_cache_bytes=int(1.1 * GB)))
    assert (panel.y_axis.shown.max(), panel.y_axis.shown.labelFormat()) == (2, "%.1f GB")


def test_a_clock_that_goes_back_restarts_the_plot(panel):
    for i in range(5):
        panel.update_stats(*loaded(time=500.0 + i))
    panel.update_stats(*loaded(time=10.0))
    assert panel.series_points("mlx_cache") == 1


def test_update_stats_is_cheap(panel):
    start = time.perf_counter()
    for i in range(1000):
        panel.update_stats(
            *loaded(time=i * 0.3, mlx_active_bytes=(i % 50) * 20 * MB, pages_used=i % 1024)
        )
    # a loose sanity bound; the cap is the real guard
    assert (time.perf_counter() - start) / 1000 < 0.05
    assert panel.series_points("mlx_active") <= MemoryPanel.MAX_POINTS


def test_the_time_axis_shows_what_was_recorded_until_the_window_is_full(panel):
    panel.update_stats(*loaded(time=10.0))
    panel.update_stats(*loaded(time=40.0))  # 30 s recorded: the last minute, in seconds
    assert (panel.x_axis.shown.min(), panel.x_axis.shown.max()) == (-60, 0)
    assert panel.x_axis.shown.labelFormat() == "%.0fs"
    assert panel.x_axis.data.max() - panel.x_axis.data.min() == 60
    panel.update_stats(*loaded(time=140.0))  # 130 s: three whole minutes, in minutes
    assert (panel.x_axis.shown.min(), panel.x_axis.shown.max()) == (-3, 0)
    assert panel.x_axis.shown.labelFormat() == "%.0fm"
    panel.update_stats(*loaded(time=600.0))  # past the window: the last five minutes
    assert (panel.x_axis.shown.min(), panel.x_axis.shown.max()) == (-5, 0)
    assert panel.x_axis.shown.labelFormat() == "%.0fm"
    assert panel.x_axis.data.max() - panel.x_axis.data.min() == panel.WINDOW_S


def test_every_figure_explains_itself(qtbot):
    """Each caption and its figure carry the same plain-words tooltip (MLX cache: not a leak;
    Locked: in use by a running request)."""
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    captions = {
        label.text(): label.toolTip()
        for label in panel.findChildren(QLabel)
        if not label.objectName() and label.text()
    }
    for key, value in panel.values.items():
        assert len(value.toolTip().split()) >= 8, key
        assert value.toolTip() in captions.values(), key
    assert "not a leak" in captions["MLX cache"]
    assert "running request" in next(tip for text, tip in captions.items() if "Locked" in text)
    assert "first to go" in next(tip for text, tip in captions.items() if "Evictable" in text)
