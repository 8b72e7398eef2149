"""bench tool-loop on the tiny model with the SDK's test server (tests/core/mcp/servers):
each step's prompt extends the last (only the new tokens computed), and after the restart
the next step's prefix comes from disk."""

from __future__ import annotations

import json
import sys

from core.cli.main import main
from tests.core.mcp.mcp_fixtures import TOOLS_SERVER


def test_bench_tool_loop_json_and_table(long_tiny_model, tmp_path, capsys):
    argv = [
        "bench",
        "tool-loop",
        "--model",
        str(long_tiny_model),
        "--data-dir",
        str(tmp_path / "data"),
        "--mcp-command",
        f"{sys.executable} {TOOLS_SERVER}",
        "--tools",
        "read_clock",  # no arguments: the random model's forced call always ends
        "--steps",
        "3",
        "--restart-after",
        "1",
        "--answer-tokens",
        "4",
    ]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for name in ("ram", "restarted"):
        rows = report[name]
        assert [r["step"] for r in rows] == [1, 2, 3, 4]
        assert [r["call"] for r in rows] == ["read_clock"] * 3 + [None]
        assert all(r["result"] == "ok" for r in rows[:3])
        for before, after in zip(rows, rows[1:]):
            assert after["prompt"] > before["prompt"]
            served = after["ram"] + after["disk"]
            assert served >= before["prompt"] - 16  # the last step's prompt, whole pages
            assert after["computed"] == after["prompt"] - served
    assert report["restarted"][1]["disk"] > 0 and report["restarted"][1]["ram"] == 0
    assert all(r["disk"] == 0 for r in report["ram"])
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "restarted after step 1" in table and "<- restart after this step" in table
