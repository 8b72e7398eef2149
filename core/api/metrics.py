"""Prometheus metrics of the API server, in a registry of its own.

Counters and the TTFT histogram are updated as requests finish; the engine's figures
(KV pool, radix tree, MLX memory) are read from ``engine.stats()`` at scrape time by a
custom collector, so a scrape never waits on the engine thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from core.engine.engine import EngineStats
from core.engine.types import RequestStats

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _EngineCollector:
    """Gauges read from the engine's latest published stats."""

    def __init__(self, read_stats: Callable[[], EngineStats], in_flight: Callable[[], int]):
        self._read_stats = read_stats
        self._in_flight = in_flight

    def collect(self) -> Iterator:
        stats = self._read_stats()
        in_flight = GaugeMetricFamily(
            "radixchat_requests_in_flight", "API requests being served now"
        )
        in_flight.add_metric([], self._in_flight())
        yield in_flight
        served = CounterMetricFamily(
            "radixchat_engine_requests", "Requests the engine has finished (API and app)"
        )
        served.add_metric([], stats.requests_served)
        yield served
        memory = GaugeMetricFamily("radixchat_mlx_memory_bytes", "MLX memory", labels=["kind"])
        memory.add_metric(["active"], stats.mlx_active_bytes)
        memory.add_metric(["cache"], stats.mlx_cache_bytes)
        memory.add_metric(["peak"], stats.mlx_peak_bytes)
        yield memory
        if stats.model is not None:
            model = InfoMetricFamily("radixchat_model", "The loaded model")
            model.add_metric(
                [],
                {
                    "name": stats.model.name,
                    "fingerprint": stats.model.fingerprint,
                    "weights_format": stats.model.weights_format,
                },
            )
            yield model
        cache = stats.cache
        if cache is None:
            return
        pages = GaugeMetricFamily("radixchat_kv_pages", "KV pool pages by state", labels=["state"])
        for state, value in (
            ("total", cache.pages_total),
            ("used", cache.pages_used),
            ("evictable", cache.pages_evictable),
            ("locked", cache.pages_locked),
        ):
            pages.add_metric([state], value)
        yield pages
        yield GaugeMetricFamily("radixchat_kv_pool_bytes", "KV pool size", value=cache.pool_bytes)
        yield GaugeMetricFamily(
            "radixchat_cache_tree_nodes", "Radix tree nodes", value=cache.tree_nodes
        )
        yield GaugeMetricFamily(
            "radixchat_cache_tree_tokens", "Tokens held by the radix tree", value=cache.tree_tokens
        )
        yield GaugeMetricFamily(
            "radixchat_cache_sessions", "Sessions holding a cache frontier", value=cache.sessions
        )
        yield GaugeMetricFamily(
            "radixchat_cache_namespaces",
            "Cache namespaces holding prefixes in RAM (prefixes are shared only inside one)",
            value=cache.namespaces,
        )
        yield GaugeMetricFamily(
            "radixchat_cache_hit_rate",
            "Prompt tokens served by the cache / prompt tokens seen, since start",
            value=cache.hit_rate,
        )
        disk = stats.disk
        if disk is None:
            return
        yield GaugeMetricFamily(
            "radixchat_disk_cache_bytes",
            "KV cache database on disk, WAL included",
            value=stats.disk_cache_bytes,
        )
        yield GaugeMetricFamily(
            "radixchat_disk_cache_pages", "Disk pages of the loaded model", value=disk.indexed_pages
        )
        written = CounterMetricFamily(
            "radixchat_disk_cache_written",
            "Written to the disk tier since "
            "the model loaded (a stored page is never written again)",
            labels=["unit"],
        )
        written.add_metric(["bytes"], disk.bytes_written)
        written.add_metric(["pages"], disk.pages_written)
        yield written
        read = CounterMetricFamily(
            "radixchat_disk_cache_read",
            "Read back from the disk tier since the model loaded",
            labels=["unit"],
        )
        read.add_metric(["bytes"], disk.read_bytes)
        read.add_metric(["tokens"], disk.read_tokens)
        read.add_metric(["reads"], disk.reads)
        yield read
        yield GaugeMetricFamily(
            "radixchat_disk_cache_writes_stopped",
            "1 while disk writes are off (disk full)",
            value=1 if disk.writes_stopped else 0,
        )


class ServerMetrics:
    """Everything ``GET /metrics`` shows."""

    def __init__(self, read_stats: Callable[[], EngineStats], in_flight: Callable[[], int]):
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "radixchat_http_requests",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "radixchat_prompt_tokens", "Prompt tokens of finished requests", registry=self.registry
        )
        self.completion_tokens = Counter(
            "radixchat_completion_tokens", "Generated tokens", registry=self.registry
        )
        self.cache_hit_tokens = Counter(
            "radixchat_cache_hit_tokens",
            "Prompt tokens served from the cache, by source",
            ["source"],
            registry=self.registry,
        )
        self.finished = Counter(
            "radixchat_finished_requests",
            "Generation requests by finish reason",
            ["finish_reason"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "radixchat_time_to_first_token_seconds",
            "From a request's arrival to its first token, queueing included",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.tier_tokens = Counter(
            "radixchat_prompt_tokens_by_tier",
            "Prompt tokens of finished "
            "requests by where they came from: the RAM cache, the disk "
            "tier, or computed",
            ["tier"],
            registry=self.registry,
        )
        for source in ("ram", "disk"):
            self.cache_hit_tokens.labels(source)
        for tier in ("ram", "disk", "computed"):
            self.tier_tokens.labels(tier)
        self.registry.register(_EngineCollector(read_stats, in_flight))

    def count_request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def record_generation(self, stats: RequestStats, ttft_s: float) -> None:
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.completion_tokens.inc(stats.completion_tokens)
        self.cache_hit_tokens.labels("ram").inc(stats.cached_tokens)
        self.cache_hit_tokens.labels("disk").inc(stats.restored_tokens)
        for tier, tokens in (
            ("ram", stats.cached_tokens),
            ("disk", stats.restored_tokens),
            ("computed", stats.computed_tokens),
        ):
            self.tier_tokens.labels(tier).inc(tokens)
        self.finished.labels(stats.finish_reason).inc()
        if stats.finish_reason != "cancelled":
            self.ttft.observe(ttft_s)

    def exposition(self) -> tuple[bytes, str]:
        """The body and content type of a scrape."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
