"""``radixchat bench restore`` on a tiny model: it runs, restores the session, reports."""

from __future__ import annotations

import json

from core.cli.main import main


def test_bench_restore_json(capsys, tiny_model, tmp_path):
    code = main(
        [
            "bench",
            "restore",
            "--model",
            str(tiny_model),
            "--data-dir",
            str(tmp_path),
            "--tokens",
            "300",
            "--repeats",
            "1",
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    ratios = [
        "ttft_ratio_restore_vs_recompute",
        "ttft_ratio_restore_vs_ram",
        "restore_read_fraction_of_disk",
    ]
    assert list(report)[-3:] == ratios
    assert all(report[key] > 0 for key in ratios)
    assert report["restored_tokens"] >= 250
    assert report["replies_identical"]
    assert all(value > 0 for value in report["ttft_s"].values())
    assert not list((tmp_path / "tmp").iterdir())  # the scratch data folder is gone


def test_bench_restore_summary_and_user_errors(capsys, tiny_model, tmp_path):
    args = [
        "bench",
        "restore",
        "--model",
        str(tiny_model),
        "--data-dir",
        str(tmp_path),
        "--repeats",
        "1",
    ]
    assert main([*args, "--tokens", "200"]) == 0
    out = capsys.readouterr().out
    assert "restore / recompute" in out and "restored from disk" in out
    assert main([*args, "--tokens", "5000"]) == 2  # beyond the tiny model's context
    assert "context" in capsys.readouterr().err
    assert main([*args, "--tokens", "10"]) == 2
    assert "--tokens" in capsys.readouterr().err


def test_bench_restore_api_mode(capsys, tiny_model, tmp_path):
    code = main(
        [
            "bench",
            "restore",
            "--api",
            "--model",
            str(tiny_model),
            "--data-dir",
            str(tmp_path),
            "--tokens",
            "300",
            "--repeats",
            "1",
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mode"] == "api" and report["replies_identical"]
    assert report["restored_tokens"] >= report["prompt_tokens"] - 64  # the unnamed prefix came back
    assert all(value > 0 for value in report["ttft_s"].values())
    assert report["repetitions"][0]["bytes_written"] > 0
    assert not list((tmp_path / "tmp").iterdir())


def test_bench_restore_api_summary(capsys, tiny_model, tmp_path):
    code = main(
        [
            "bench",
            "restore",
            "--api",
            "--model",
            str(tiny_model),
            "--data-dir",
            str(tmp_path),
            "--tokens",
            "300",
            "--repeats",
            "1",
        ]
    )
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[0].startswith(f"model: {tiny_model} (")
        and "API, unnamed client; medians of 1" in lines[0]
    )
    assert lines[1].startswith("first prompt ") and "after the restart the follow-up" in lines[1]
    assert lines[1].endswith(" from disk")
    assert (
        lines[2].startswith("TTFT (client side): restored ")
        and "recomputed" in lines[2]
        and "RAM hit" in lines[2]
    )
    assert "(target <= 0.05)" in lines[3] and "(target <= 1.5)" in lines[3]
    assert lines[4] == "replies: identical in all three ways"
