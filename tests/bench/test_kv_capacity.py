"""``radixchat bench kv-capacity`` on a tiny model: every format runs, restores, reports."""

from __future__ import annotations

import json

from core.cli.main import main
from core.models.tiny_model import TinyModelSpec, write_tiny_model


def test_bench_kv_capacity_json(capsys, tmp_path):
    model = write_tiny_model(
        tmp_path / "m", TinyModelSpec(hidden_size=128, max_position_embeddings=2048)
    )
    args = ["bench", "kv-capacity", "--model", str(model), "--data-dir", str(tmp_path)]
    args += ["--tokens", "300", "--budget-mb", "1", "--decode-tokens", "8", "--repeats", "1"]
    assert main([*args, "--group-size", "32", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    medians, ratios = report["medians"], report["ratios_vs_full"]
    assert list(medians) == ["full", "8-bit", "4-bit"]
    for label, m in medians.items():
        assert m["restored_tokens"] >= 250 and m["decode_tokens_per_s"] > 0
        assert m["mlx_lm_decode_tokens_per_s"] > 0
        assert m["kv_format"] == (
            "full: float32" if label == "full" else f"full: {label} (group 32)"
        )
    # what the stored formats come to (bytes of the layout, not timings)
    assert ratios["4-bit"]["pool_tokens"] > ratios["8-bit"]["pool_tokens"] > 1
    assert ratios["4-bit"]["disk_bytes_per_token"] < ratios["8-bit"]["disk_bytes_per_token"] < 1
    assert set(report["targets"]) == {
        "8-bit pool_tokens",
        "8-bit disk_bytes_per_token",
        "8-bit decode_tokens_per_s",
        "4-bit pool_tokens",
    }
    assert not list((tmp_path / "tmp").iterdir())  # the scratch data folders are gone
