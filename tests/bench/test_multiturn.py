"""``radixchat bench multiturn`` on a tiny generated model: four ways, one conversation."""

from __future__ import annotations

import json

from bench.multiturn import WAYS
from core.cli.main import EXIT_USER_ERROR, main
from core.models.tiny_model import write_tiny_model


def test_bench_multiturn_json(tmp_path, capsys):
    path = write_tiny_model(tmp_path / "tiny")
    argv = [
        "bench",
        "multiturn",
        "--model",
        str(path),
        "--turns",
        "3",
        "--max-tokens",
        "8",
        "--repeats",
        "1",
        "--json",
        "--data-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)

    assert list(report)[-3:] == [
        "ttft_ratio_vs_recompute",
        "ttft_ratio_vs_mlx_lm_cache",
        "decode_ratio_vs_mlx_lm",
    ]
    for key in (
        "model",
        "fingerprint",
        "machine",
        "pool_tokens",
        "page_size",
        "prompt_tokens",
        "cached_tokens",
        "ttft_s",
        "decode_tps",
        "replies_identical",
        "mismatches",
    ):
        assert key in report
    assert report["replies_identical"] is True and report["mismatches"] == []
    assert report["ttft_ratio_vs_recompute"] > 0
    assert report["ttft_ratio_vs_mlx_lm_cache"] > 0
    assert report["decode_ratio_vs_mlx_lm"] > 0
    for way in WAYS:
        assert len(report["ttft_s"][way]) == len(report["decode_tps"][way]) == 3
        assert all(v > 0 for v in report["ttft_s"][way])
    ours = report["cached_tokens"]["ours_cached"]
    theirs = report["cached_tokens"]["mlx_lm_cache"]
    assert ours[0] == 0 and 0 < ours[1] < ours[2]
    assert theirs[0] == 0 and 0 < theirs[1] < theirs[2]
    prompts = report["prompt_tokens"]
    assert prompts[0] < prompts[1] < prompts[2]
    assert all(c < p for c, p in zip(ours, prompts))  # the last prompt token is always computed
    assert report["completion_tokens"] == [8, 8, 8]  # the tiny model never says EOS


def test_bench_multiturn_table_and_bad_args(tmp_path, capsys):
    path = write_tiny_model(tmp_path / "tiny")
    argv = [
        "bench",
        "multiturn",
        "--model",
        str(path),
        "--turns",
        "2",
        "--max-tokens",
        "4",
        "--repeats",
        "1",
        "--data-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "replies: identical in all four ways" in out
    assert "last turn TTFT, ours+cache / mlx-lm with reuse" in out
    assert main(argv[:4] + ["--turns", "99"] + argv[6:]) == EXIT_USER_ERROR
    assert "--turns can be at most" in capsys.readouterr().err
    assert (
        main(["bench", "multiturn", "--model", str(tmp_path / "nope"), "--data-dir", str(tmp_path)])
        == EXIT_USER_ERROR
    )
    assert "no model at" in capsys.readouterr().err
