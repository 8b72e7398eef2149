"""``radixchat bench hostile`` on a tiny generated model, with small counts: the report's
shape and that every scene measured the other client (its timings are the benchmark's
business, not a test's)."""

from __future__ import annotations

import json

from core.cli.main import main
from core.models.tiny_model import TinyModelSpec, write_tiny_model


def test_bench_hostile_json_and_table(tmp_path, capsys):
    path = write_tiny_model(
        tmp_path / "tiny", TinyModelSpec(num_layers=2, max_position_embeddings=4096)
    )
    argv = [
        "bench",
        "hostile",
        "--model",
        str(path),
        "--data-dir",
        str(tmp_path),
        "--connections",
        "200",
        "--streams",
        "3",
        "--long-tokens",
        "2000",
        "--tools",
        "2000",
        "--probes",
        "2",
        "--kv-tokens",
        "16384",
    ]
    assert main(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target_s"] == 2.0
    scenes = {scene["name"]: scene for scene in report["scenes"]}
    assert list(scenes) == ["quiet", "flood", "greedy", "tools"]
    for scene in scenes.values():
        assert not scene["failures"], scene
        assert len(scene["probes"]) in (2, 4) and scene["worst_s"] == max(
            scene["probes"] + scene["ends"]
        )
    assert scenes["flood"]["attacker"]["connections_opened"] >= 200
    greedy = scenes["greedy"]
    assert (
        len(greedy["ends"]) == 2 and len(greedy["attacker"]["streams_running_at_each_probe"]) == 2
    )
    assert scenes["tools"]["attacker"]["statuses"] == [400]  # 2,000 tools: past the limit, refused
    assert main(argv + ["--scenes", "quiet"]) == 0
    table = capsys.readouterr().out
    assert "the other client's answer: worst" in table and "target" in table
