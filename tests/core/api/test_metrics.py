"""The Prometheus metrics of the API server, read back through the exposition format."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from core.api.guard import endpoint_label
from core.api.metrics import ServerMetrics
from core.engine.engine import EngineStats
from core.engine.types import RequestStats
from kvcache.stats import CacheStats

CACHE = CacheStats(
    enabled=True,
    disabled_reason=None,
    page_size=16,
    pages_total=100,
    pages_used=40,
    pages_evictable=30,
    pages_locked=10,
    pool_bytes=1 << 20,
    tree_nodes=7,
    tree_tokens=600,
    snapshots=0,
    snapshot_bytes=0,
    hits=3,
    misses=1,
    hit_tokens=300,
    prompt_tokens=400,
    evicted_tokens=0,
    evicted_pages=0,
    sessions=2,
    namespaces=3,
)


def samples(metrics: ServerMetrics) -> dict[tuple[str, tuple], float]:
    data, content_type = metrics.exposition()
    assert content_type.startswith("text/plain")
    found = {}
    for family in text_string_to_metric_families(data.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_engine_figures_are_read_at_scrape_time():
    stats = [
        EngineStats(
            cache=CACHE, mlx_active_bytes=5, mlx_cache_bytes=6, mlx_peak_bytes=7, requests_served=9
        )
    ]
    metrics = ServerMetrics(lambda: stats[0], lambda: 2)
    got = samples(metrics)
    assert got[("radixchat_requests_in_flight", ())] == 2
    assert got[("radixchat_engine_requests_total", ())] == 9
    assert got[("radixchat_mlx_memory_bytes", (("kind", "peak"),))] == 7
    assert got[("radixchat_kv_pages", (("state", "evictable"),))] == 30
    assert got[("radixchat_cache_hit_rate", ())] == 0.75
    assert got[("radixchat_cache_sessions", ())] == 2
    assert got[("radixchat_cache_namespaces", ())] == 3
    stats[0] = EngineStats()  # no model, no cache yet: no cache figures, no error
    got = samples(metrics)
    assert ("radixchat_kv_pages", (("state", "total"),)) not in got
    assert got[("radixchat_mlx_memory_bytes", (("kind", "active"),))] == 0


def test_requests_and_generations_are_counted():
    metrics = ServerMetrics(EngineStats, lambda: 0)
    metrics.count_request("/v1/chat/completions", 200)
    metrics.count_request("/v1/chat/completions", 200)
    metrics.count_request("other", 404)
    metrics.record_generation(
        RequestStats(
            prompt_tokens=20,
            cached_tokens=8,
            restored_tokens=4,
            completion_tokens=5,
            finish_reason="length",
        ),
        ttft_s=0.3,
    )
    metrics.record_generation(RequestStats(prompt_tokens=3, finish_reason="cancelled"), ttft_s=9.0)
    got = samples(metrics)
    assert (
        got[
            (
                "radixchat_http_requests_total",
                (("endpoint", "/v1/chat/completions"), ("status", "200")),
            )
        ]
        == 2
    )
    assert got[("radixchat_http_requests_total", (("endpoint", "other"), ("status", "404")))] == 1
    assert got[("radixchat_prompt_tokens_total", ())] == 23
    assert got[("radixchat_completion_tokens_total", ())] == 5
    assert got[("radixchat_cache_hit_tokens_total", (("source", "ram"),))] == 8
    assert got[("radixchat_cache_hit_tokens_total", (("source", "disk"),))] == 4
    assert got[("radixchat_finished_requests_total", (("finish_reason", "cancelled"),))] == 1
    # a cancelled request has no first token: it stays out of the TTFT histogram
    assert got[("radixchat_time_to_first_token_seconds_count", ())] == 1
    assert got[("radixchat_time_to_first_token_seconds_bucket", (("le", "0.5"),))] == 1
    assert got[("radixchat_time_to_first_token_seconds_bucket", (("le", "0.25"),))] == 0


def test_endpoint_labels_are_bounded():
    assert endpoint_label("/v1/chat/completions/") == "/v1/chat/completions"
    assert endpoint_label("/v1/models/anything/at/all") == "/v1/models/{model}"
    assert endpoint_label("/v1/messages/count_tokens") == "/v1/messages/count_tokens"
    assert {endpoint_label(f"/random/{i}") for i in range(50)} == {"other"}
