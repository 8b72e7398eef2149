"""``radixchat bench soak`` for 45 s on a tiny generated model (about 65 s of wall time on 2
cores): the run completes with its restart, the report has its figures, no 5xx, no reply
that differs from the server without a cache; and the parts that sort what it counts."""

from __future__ import annotations

import json
import tempfile

import psutil
import pytest

from bench.soak import Sample, _print_report, _rss
from bench.soak_clients import KEYS, PLANS, Restart, _translate
from bench.soak_wire import Reply, StreamFailed, ToolCall, error_kind
from core.cli.main import main

STORE_FILES = {
    "kvcache.db",
    "kvcache.db-wal",
    "responses.db",
    "responses.db-wal",
    "chats.db",
    "chats.db-wal",
}


def test_a_short_soak(long_tiny_model, tmp_path, capsys, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the soak's folders go
    argv = [
        "bench",
        "soak",
        "--model",
        str(long_tiny_model),
        "--data-dir",
        str(tmp_path / "data"),
        "--minutes",
        "0.4",
        "--sample-s",
        "2.5",
        "--disk-budget-mb",
        "4",  # the stores fill and evict within the run
        "--request-timeout-s",
        "60",
        "--json",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    samples = report["samples"]
    assert len(samples) >= 5 and {s["process"] for s in samples} == {1, 2}
    for sample in samples:
        assert sample["rss_bytes"] > 0 and sample["open_fds"] > 0
        assert set(sample["disk_bytes"]) == STORE_FILES
    assert samples[-1]["disk_bytes"]["kvcache.db"] > 0
    assert samples[-1]["disk_bytes"]["responses.db"] > 0
    assert report["restart"]["exit_status"] == 0 and report["final_stop"]["exit_status"] == 0
    requests = report["requests"]
    for dialect in ("chat", "messages", "responses"):
        assert requests["by_dialect"][dialect]["ok"] > 0, requests
    assert sum(d.get("dropped", 0) for d in requests["by_dialect"].values()) > 0
    assert requests["server_errors"] == 0, requests
    assert requests["replies_compared"] > 0 and requests["mismatches"] == 0, requests
    stores = report["stores"]
    assert set(stores) == {"kvcache", "responses", "chats", "data_folder"}
    # each key within its share of the stored responses (the padded client's key filled it)
    assert stores["responses"]["within"] and stores["kvcache"]["within"], stores
    assert set(stores["responses"]["per_key_counted_max_bytes"]) == {"alpha", "bravo", "charlie"}
    assert report["rss"]["reference_bytes"] and report["rss"]["end_bytes"]
    assert set(report["targets"]) == {"rss_flat", "stores_within_budget", "no_5xx", "no_mismatches"}
    assert report["targets"]["no_5xx"] and report["targets"]["no_mismatches"]
    _print_report(report)  # the table, from the same figures
    table = capsys.readouterr().out
    assert "restart: stopped in" in table and "replies compared with --no-cache:" in table
    assert table.count("pass  ") + table.count("FAIL  ") == 4
    assert not list(scratch.iterdir())  # its folders are gone
    assert not psutil.Process().children(recursive=True)  # and its servers


def test_the_plans_cover_the_three_dialects_and_the_keys():
    assert len(PLANS) == 8
    assert {plan.dialect for plan in PLANS} == {"chat", "messages", "responses", "conversations"}
    assert {plan.key for plan in PLANS} == set(range(len(KEYS)))
    assert any(plan.stream == 1.0 for plan in PLANS) and any(plan.padded for plan in PLANS)


def test_a_failure_overlapping_the_restart_counts_apart():
    restart = Restart()
    assert not restart.covers(0, 10**9)  # no restart yet
    restart.begin()
    began = restart.began
    assert restart.covers(began - 5, began + 0.1)  # in flight when it stopped
    assert not restart.covers(began - 5, began - 1)  # over before
    restart.end()
    assert restart.covers(restart.ended - 0.1, restart.ended + 1)
    assert not restart.covers(restart.ended + 1, restart.ended + 2)  # sent once it was back


class _StatusError(Exception):
    def __init__(self, status):
        self.status_code = status


class APIError(Exception):
    """What the openai package raises for an error event in a stream."""


class RemoteProtocolError(Exception):
    """httpx's, for a connection closed mid-reply."""


@pytest.mark.parametrize(
    ("exc", "kind", "server_side"),
    [
        (_StatusError(500), "HTTP 500", True),
        (_StatusError(503), "HTTP 503", True),
        (_StatusError(404), "HTTP 404", False),
        (_StatusError(200), "error event in a stream", True),  # anthropic's, after a 200
        (APIError(), "error event in a stream", True),
        (StreamFailed("x"), "error event in a stream", True),
        (RemoteProtocolError(), "reply cut short", True),
        (TimeoutError(), "TimeoutError", False),
    ],
)
def test_errors_sorted_by_kind(exc, kind, server_side):
    assert error_kind(exc) == (kind, server_side)


def test_a_mirrored_chain_continues_the_reference_servers_own_ids():
    ids = {"resp_a": "resp_b", "call_a": "call_b", "conv_a": "conv_b"}
    body = {
        "previous_response_id": "resp_a",
        "conversation": "conv_a",
        "input": [{"type": "function_call_output", "call_id": "call_a", "output": "1"}, "hi"],
    }
    assert _translate(body, ids) == {
        "previous_response_id": "resp_b",
        "conversation": "conv_b",
        "input": [{"type": "function_call_output", "call_id": "call_b", "output": "1"}, "hi"],
    }
    assert body["previous_response_id"] == "resp_a"  # the cached server's body is left alone


def test_replies_compare_text_and_tool_calls_not_their_ids():
    one = Reply("Paris", (ToolCall("get_weather", '{"city": "Paris"}', "call_1"),))
    assert one.same_as(Reply("Paris", (ToolCall("get_weather", '{"city": "Paris"}', "call_2"),)))
    assert not one.same_as(Reply("Paris", ()))
    assert not one.same_as(Reply("Pari", one.tool_calls))


def _sample(t_s: float, rss: int, process: int = 1) -> Sample:
    return Sample(t_s, process, rss, 10, 3, {}, {}, 0, 0)


def test_rss_flat_compares_the_end_with_the_warm_up():
    # a 30-minute run: warm-up 10 min, windows of a minute
    flat = [_sample(t, 100 + (t > 300) * 20) for t in range(0, 1801, 15)]
    assert _rss(flat, 1800, 15)["within"] and _rss(flat, 1800, 15)["drift"] == 0
    growing = [_sample(t, 120 + t // 60) for t in range(600, 1801, 15)]
    result = _rss(growing, 1800, 15)
    assert not result["within"] and result["drift"] == pytest.approx((149 - 130) / 130, abs=1e-4)
    short = _rss([_sample(t, 100) for t in range(0, 61, 5)], 60, 5)  # warm-up: the first third
    assert short["warmup_s"] == 20 and short["within"]


def test_rss_end_is_the_last_sample_when_a_slow_restart_ran_past_the_run():
    # a 24 s run restarted at 12 s: the second process answered at 27 s, sampled once then
    samples = [_sample(t, 100) for t in (0, 2.5, 5, 7.5, 10)] + [_sample(27.4, 100, process=2)]
    result = _rss(samples, 24, 2.5)
    assert result["reference_bytes"] == 100 and result["end_bytes"] == 100
    assert result["processes"][1]["end_bytes"] == 100
