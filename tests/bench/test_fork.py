"""``radixchat bench fork`` on a tiny generated model: a branch's history is served from RAM,
then from disk after the restart, and recomputed with the cache off; its table."""

from __future__ import annotations

import json

from bench.fork import format_fork
from core.cli.main import main


def test_a_branch_is_served_from_ram_then_from_disk_and_recomputed(
    long_tiny_model, tmp_path, capsys
):
    argv = ["bench", "fork", "--model", str(long_tiny_model), "--data-dir", str(tmp_path)]
    assert main([*argv, "--turns", "2", "--lines", "2", "--repeats", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (run,) = report["runs"]
    prompt = run["ram"]["prompt_tokens"]
    assert prompt == run["recompute"]["prompt_tokens"] > 300
    assert abs(run["disk"]["prompt_tokens"] - prompt) < 10  # another question, as long
    assert run["ram"]["cached_tokens"] >= prompt // 2 and run["ram"]["restored_tokens"] == 0
    assert prompt // 2 <= run["disk"]["restored_tokens"] < prompt  # the history, not the question
    assert run["disk"]["cached_tokens"] == 0
    assert run["recompute"]["computed_tokens"] == prompt
    assert report["recompute_over_ram"] > 0 and report["recompute_over_disk"] > 0
    table = format_fork(report)
    assert "| RAM (the history in the prefix cache) |" in table and "after a restart" in table
