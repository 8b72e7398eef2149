"""``radixchat bench distributed``: both servers come up, every row has its figures, and the
split model's greedy replies are the single process's."""

from __future__ import annotations

import json

import pytest

from bench.distributed import format_table
from core.cli.main import main
from tests.core.distributed.group_fixture import needs_ring


@needs_ring
@pytest.mark.distributed
def test_bench_distributed_reports_both_ways(capsys, tiny_model):
    code = main(
        [
            "bench",
            "distributed",
            "--model",
            str(tiny_model),
            "--repeats",
            "1",
            "--prompt-tokens",
            "40",
            "--max-tokens",
            "6",
            "--kv-tokens",
            "2048",
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["same_greedy_replies"] is True
    assert [row["cache"] for row in report["rows"]] == ["uncached", "cached"]
    for row in report["rows"]:
        for mode in ("single", "split2"):
            assert row[f"{mode}_ttft_s"] > 0 and row[f"{mode}_decode_tps"] > 0
    uncached, cached = report["rows"]
    # uncached: only the chat template's first tokens, which the warm-up request left
    assert (
        uncached["split2_cached_tokens"]
        == uncached["single_cached_tokens"]
        < uncached["prompt_tokens"] / 2
    )
    assert (
        cached["split2_cached_tokens"]
        == cached["single_cached_tokens"]
        == cached["prompt_tokens"] - 1
    )
    # what the command prints without --json: the same report as a table
    table = format_table(report).splitlines()
    assert table[0] == (
        f"bench distributed: {tiny_model.name}, 1 process vs 2 ranks (tensor split) on "
        f"{report['transport']}, medians of 1, 6 tokens a reply"
    )
    assert table[1].split()[:2] == ["prompt", "cache"] and [
        row.split()[1] for row in table[2:4]
    ] == ["uncached", "cached"]
    assert all(row.count("ms") == 2 and row.count("t/s") == 2 for row in table[2:4])
    assert table[-1] == "greedy replies the same split and not: yes"
