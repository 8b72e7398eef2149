"""``radixchat bench constrain`` on a tiny generated model: every mode runs, the report's
shape and the table a person reads (the figures are the benchmark's, never asserted)."""

from __future__ import annotations

import json

from core.cli.main import main
from core.models.load.chat_template import SMOLLM2_TOOLS_TEMPLATE
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from resources import resource_path

MODES = ("free", "json_schema", "tool_required", "4_free", "2_free_2_constrained")


def test_bench_constrain_json_and_table(tmp_path, capsys):
    # the tool's prompt
    path = write_tiny_model(tmp_path / "tiny", TinyModelSpec(max_position_embeddings=4096))
    argv = [
        "bench",
        "constrain",
        "--model",
        str(path),
        "--repeats",
        "1",
        "--max-tokens",
        "8",
        "--chat-template",
        str(resource_path(SMOLLM2_TOOLS_TEMPLATE)),
        "--data-dir",
        str(tmp_path),
    ]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (
        report["library"] == "llguidance" and report["repeats"] == 1 and report["max_tokens"] == 8
    )
    assert set(report["decode_tokens_per_s"]) == set(MODES)
    assert all(len(runs) == 1 for runs in report["runs"].values())
    assert set(report["cost_ms_per_token"]) == {
        "json_schema",
        "tool_required",
        "batch_2_of_4_constrained",
    }
    assert all(v >= 0 for v in report["constraint_cpu_ms_per_token"].values())

    assert main(argv) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert [line.split(":")[0].strip() for line in lines[:5]] == list(MODES)
    assert all(line.endswith("tok/s") for line in lines[:5])
    assert [line.split(":")[0] for line in lines[5:8]] == [
        "wall-clock cost of json_schema",
        "wall-clock cost of tool_required",
        "wall-clock cost of batch_2_of_4_constrained",
    ]
    assert all(line.endswith("ms per token") for line in lines[5:])
    assert [line.split(":")[0] for line in lines[8:]] == [
        "grammar CPU time, json_schema",
        "grammar CPU time, tool_required",
        "grammar CPU time, json_schema_batched",
    ]
    assert "repetition 1/1" in captured.err


def test_a_template_without_tools_runs_through_the_generic_tool_format(tmp_path, capsys):
    """The tiny model's own template takes no tools: the tool modes run anyway, their calls
    in the generic format (core.engine.generic_tools), as any client's tools would."""
    path = write_tiny_model(tmp_path / "tiny", TinyModelSpec(max_position_embeddings=4096))
    argv = ["bench", "constrain", "--model", str(path), "--repeats", "1", "--max-tokens", "8"]
    assert main([*argv, "--data-dir", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["decode_tokens_per_s"]) == set(MODES)
    assert report["decode_tokens_per_s"]["tool_required"] > 0  # the forced call was decoded
