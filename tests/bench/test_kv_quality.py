"""``radixchat bench kv-quality`` on tiny models: it runs every format and reports."""

from __future__ import annotations

import json

from bench.kv_quality import _agreement, first_difference_margin
from core.cli.main import main
from core.models.tiny_model import TinyModelSpec, write_tiny_model


def test_agreement_counts_positions_and_the_common_start():
    reference = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert _agreement(reference, reference) == (1.0, 1.0)
    same, prefix = _agreement(reference, [[1, 2, 9, 4], [5, 6, 7, 8]])
    assert same == 7 / 8 and prefix == 6 / 8


def test_first_difference_margin_is_full_precisions_lead_where_each_reply_parts():
    reference = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    margins = [[0.5, 0.25, 2.0], [1.0, 3.0, 0.75], [4.0, 4.0, 4.0]]
    # the first reply parts at 1 (lead 0.25), the second at 2 (0.75), the third never
    assert first_difference_margin(reference, [[1, 9, 9], [4, 5, 9], [7, 8, 9]], margins) == 0.5
    assert first_difference_margin(reference, reference, margins) is None


def test_bench_kv_quality_json(capsys, tmp_path):
    models = [
        write_tiny_model(tmp_path / kind, TinyModelSpec(kind=kind, num_layers=n, hidden_size=128))
        for kind, n in (("llama", 2), ("sliding", 4))
    ]
    args = ["bench", "kv-quality", "--data-dir", str(tmp_path), "--models", *map(str, models)]
    assert main([*args, "--prompts", "3", "--max-tokens", "6", "--group-size", "32", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [m["model"] for m in report["models"]] == [str(m) for m in models]
    for result in report["models"]:
        formats = result["formats"]
        assert list(formats) == ["full", "8-bit", "4-bit"]
        full = formats["full"]
        assert full["greedy_agreement"] == 1.0 and full["loglik_diff"] == 0.0
        assert full["teacher_forced_agreement"] == 1.0 and full["first_difference_margin"] is None
        assert full["mlx_lm_agreement"] == 1.0  # mlx-lm's full precision against itself
        for label in ("8-bit", "4-bit"):
            figures = (
                "greedy_agreement",
                "mlx_lm_agreement",
                "vs_mlx_lm",
                "teacher_forced_agreement",
            )
            for figure in figures:
                assert 0.0 <= formats[label][figure] <= 1.0
            margin = formats[label]["first_difference_margin"]
            assert margin is None or margin >= 0.0
            assert formats[label]["kv_bytes_per_token"] < full["kv_bytes_per_token"]
            assert formats[label]["kv_format"]["full"] == f"{label} (group 32)"
        assert formats["4-bit"]["kv_bytes_per_token"] < formats["8-bit"]["kv_bytes_per_token"]
