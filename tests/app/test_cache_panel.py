"""The cache panel fed with RequestStats (and stored dicts of them) and the engine's totals."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtWidgets import QLabel  # noqa: E402

from app.cache_panel import CachePanel, TurnSplit  # noqa: E402
from core.engine.engine import EngineStats  # noqa: E402
from core.engine.types import RequestStats  # noqa: E402
from kvcache.stats import CacheStats  # noqa: E402


def turn(ram: int, disk: int, computed: int, ttft: float = 0.1) -> dict:
    """A finished turn as the chat store keeps it: dataclasses.asdict(RequestStats)."""
    return dataclasses.asdict(
        RequestStats(
            prompt_tokens=ram + disk + computed,
            cached_tokens=ram,
            restored_tokens=disk,
            computed_tokens=computed,
            completion_tokens=40,
            ttft_s=ttft,
            prefill_tps=1000.0,
            decode_tps=50.0,
            total_s=1.0,
        )
    )


@pytest.fixture
def panel(qtbot):
    panel = CachePanel()
    qtbot.addWidget(panel)
    panel.resize(360, 520)
    panel.show()
    return panel


def text(panel: CachePanel, name: str) -> str:
    label = panel.findChild(QLabel, name)
    assert label is not None, name
    return label.text()


def bars(panel: CachePanel) -> list[tuple[float, float, float]]:
    sets = (panel.ram_set, panel.disk_set, panel.computed_set)
    assert len({s.count() for s in sets}) == 1
    return [tuple(s.at(i) for s in sets) for i in range(panel.ram_set.count())]


def test_empty_until_the_first_turn(panel):
    assert panel.plot_stack.currentWidget() is panel.empty_label and panel.empty_label.isVisible()
    for name in (
        "lastTurnValue",
        "ttftValue",
        "sessionHitRateValue",
        "appHitRateValue",
        "evictionsValue",
    ):
        assert text(panel, name) == "—"
    assert bars(panel) == []

    # as the bridge hands it over
    panel.add_turn(RequestStats(prompt_tokens=512, computed_tokens=512, ttft_s=0.42))
    assert panel.plot_stack.currentWidget() is panel.chart_view
    assert bars(panel) == [(0, 0, 512)]


def test_turns_split_into_ram_disk_and_computed(panel):
    turns = [turn(0, 0, 512, 0.42), turn(480, 0, 32, 0.05), turn(0, 900, 124, 0.3)]
    for stats in turns:
        assert (
            stats["cached_tokens"] + stats["restored_tokens"] + stats["computed_tokens"]
            == stats["prompt_tokens"]
        )
        panel.add_turn(stats)
    assert bars(panel) == [(0, 0, 512), (480, 0, 32), (0, 900, 124)]
    ttft = panel.ttft_series
    assert [(ttft.at(i).x(), ttft.at(i).y()) for i in range(ttft.count())] == [
        (0, 0.42),
        (1, 0.05),
        (2, 0.3),
    ]
    assert text(panel, "lastTurnValue") == "1,024 prompt tokens: 0 RAM · 900 disk · 124 computed"
    assert text(panel, "ttftValue") == "300 ms"
    # (0 + 480 + 900) / (512 + 512 + 1024) = 67.4%
    assert text(panel, "sessionHitRateValue") == "67% of 2,048 tokens · 3 turns"
    # with headroom
    assert panel.tokens_axis.data.max() >= 1024 and panel.ttft_axis.data.max() > 0.42
    assert panel.ttft_axis.shown.labelFormat() == "%.0f ms"
    assert panel.ttft_axis.shown.max() == pytest.approx(1000 * panel.ttft_axis.data.max())


def test_set_turns_replaces_the_history(panel):
    panel.set_turns([turn(0, 0, 100), turn(100, 0, 20)])
    panel.add_turn(turn(120, 0, 30))
    panel.set_turns([turn(0, 50, 50, ttft=1.5)])
    assert bars(panel) == [(0, 50, 50)]
    assert text(panel, "sessionHitRateValue") == "50% of 100 tokens · 1 turn"
    assert text(panel, "ttftValue") == "1.50 s"
    assert panel.ttft_axis.shown.labelFormat() == "%.1f s" and panel.ttft_axis.shown.max() == 2
    panel.set_turns([])
    assert bars(panel) == [] and panel.plot_stack.currentWidget() is panel.empty_label
    assert text(panel, "lastTurnValue") == "—"


def test_only_the_last_turns_are_plotted_and_numbered(panel):
    panel.set_turns([turn(i, 0, 10) for i in range(30)])
    assert len(bars(panel)) == CachePanel.MAX_BARS
    assert bars(panel)[0] == (10, 0, 10) and bars(panel)[-1] == (29, 0, 10)
    shown = panel.x_axis.shown  # turn numbers 11..30 over bar positions 0..19
    assert (shown.min(), shown.max()) == (10.5, 30.5)
    assert (panel.x_axis.data.min(), panel.x_axis.data.max()) == (-0.5, 19.5)
    # the rate covers every turn, not just those plotted
    assert "30 turns" in text(panel, "sessionHitRateValue")


def test_a_few_turns_keep_narrow_bars(panel):
    panel.add_turn(turn(0, 0, 10))
    assert panel.x_axis.data.max() - panel.x_axis.data.min() == CachePanel.MIN_SLOTS
    assert (panel.x_axis.shown.min(), panel.x_axis.shown.max()) == (0.5, CachePanel.MIN_SLOTS + 0.5)


def test_large_prompts_label_the_axis_in_thousands(panel):
    panel.add_turn(turn(30_000, 0, 2_000))
    assert panel.tokens_axis.shown.labelFormat().endswith("k")
    assert panel.tokens_axis.data.max() == 1000 * panel.tokens_axis.shown.max() >= 32_000


def test_odd_turns_never_draw_negative_bars(panel):
    panel.add_turn(
        {"prompt_tokens": 100, "cached_tokens": -5, "restored_tokens": None, "computed_tokens": 20}
    )
    # parts exceed the prompt
    panel.add_turn({"prompt_tokens": 10, "cached_tokens": 30, "computed_tokens": 5})
    panel.add_turn({})  # nothing known
    assert bars(panel) == [(0, 0, 20), (30, 0, 5), (0, 0, 0)]
    assert all(value >= 0 for row in bars(panel) for value in row)
    assert (
        TurnSplit.of({"prompt_tokens": 10, "cached_tokens": 30, "computed_tokens": 5}).prompt == 35
    )
    assert text(panel, "lastTurnValue") == "0 prompt tokens: 0 RAM · 0 disk · 0 computed"
    # 30 / (100 + 35 + 0)
    assert text(panel, "sessionHitRateValue") == "22% of 135 tokens · 3 turns"


def totals(**cache) -> EngineStats:
    """The engine's figures as the bridge hands them over, with these cache figures."""
    figures = {
        f.name: 0 for f in dataclasses.fields(CacheStats) if f.default is dataclasses.MISSING
    }
    figures.update({"enabled": True, "disabled_reason": None, **cache})
    return EngineStats(cache=CacheStats(**figures), rss_bytes=1)


def test_totals_show_the_app_hit_rate_and_evictions(panel):
    panel.update_totals(
        totals(hit_tokens=41_200, prompt_tokens=49_400, evicted_pages=12, evicted_tokens=768)
    )
    assert text(panel, "appHitRateValue") == "83% of 49,400 tokens"
    assert text(panel, "evictionsValue") == "768 tokens (12 pages)"
    panel.update_totals(totals(hit_tokens=10, prompt_tokens=40))  # the rate: worked out
    assert text(panel, "appHitRateValue") == "25% of 40 tokens"
    assert text(panel, "evictionsValue") == "none"
    panel.update_totals(EngineStats())  # no cache
    assert text(panel, "appHitRateValue") == "—"


def test_the_namespace_that_served_the_turn_is_shown(panel):
    assert text(panel, "namespaceValue") == "—"
    panel.add_turn(
        RequestStats(prompt_tokens=100, cached_tokens=80, computed_tokens=20, cache_namespace="app")
    )
    assert text(panel, "namespaceValue") == "app"
    assert text(panel, "lastTurnValue").endswith("(namespace app)")
    panel.update_totals(totals(hit_tokens=80, prompt_tokens=100, namespaces=3))
    assert text(panel, "namespaceValue") == "app · 3 in RAM"
    panel.set_turns([turn(0, 0, 512)])  # a turn stored before namespaces: none named
    assert text(panel, "namespaceValue") == "— · 3 in RAM"
    assert "namespace" not in text(panel, "lastTurnValue")


def test_every_figure_explains_itself(qtbot):
    """Each caption and its figure carry a plain-words tooltip (Evictions, Namespace...)."""
    from PySide6.QtWidgets import QLabel

    panel = CachePanel()
    qtbot.addWidget(panel)
    captions = {
        label.text(): label.toolTip()
        for label in panel.findChildren(QLabel)
        if not label.objectName() and label.text()
    }
    for key, value in panel.values.items():
        assert len(value.toolTip().split()) >= 8, key
    assert "dropped from RAM" in captions["Evictions"] and "room" in captions["Evictions"]
    assert "no client sees another's prompts" in captions["Namespace"]
    assert "computed by the model now" in captions["Last turn"]


def test_the_kv_format_is_shown_per_layer_kind(panel):
    assert text(panel, "kvFormatValue") == "—"
    formats = (("full", "8-bit (group 64)"), ("sliding", "float32 (mlx-lm has no ...)"))
    panel.update_totals(totals(cached_as="pages+snapshots", kv_formats=formats))
    assert text(panel, "kvFormatValue") == (
        "attention: 8-bit (group 64)\nsliding window: float32 (mlx-lm has no ...)"
    )
    assert "quantized to 8 or 4 bits" in panel.values["kvFormat"].toolTip()
    panel.update_totals(totals(enabled=False, disabled_reason="off", kv_formats=formats))
    assert text(panel, "kvFormatValue") == "—"


def test_how_the_model_is_cached_is_shown(panel):
    assert text(panel, "cachedAsValue") == "—"
    panel.update_totals(
        totals(cached_as="pages+snapshots", layout="4 caches in 4 slots: 2 full, 2 sliding")
    )
    assert text(panel, "cachedAsValue") == "KV pages + state snapshots"
    tip = panel.values["cachedAs"].toolTip()  # what it means, then this model's layout
    assert tip.startswith("How this model's prompts are kept for reuse")
    assert tip.endswith("\n\n4 caches in 4 slots: 2 full, 2 sliding")
    panel.update_totals(totals(cached_as="snapshots"))
    assert text(panel, "cachedAsValue") == "state snapshots (no full-attention layer)"
    panel.update_totals(totals(cached_as="pages"))
    assert text(panel, "cachedAsValue") == "KV pages"
    panel.update_totals(totals(enabled=False, disabled_reason="disabled by the user (--no-cache)"))
    assert text(panel, "cachedAsValue") == "off: disabled by the user (--no-cache)"
    panel.update_totals(EngineStats())  # no model
    assert text(panel, "cachedAsValue") == "—"
