"""``radixchat bench serve`` on a tiny generated model: one client vs two at once."""

from __future__ import annotations

import json

from core.cli.main import EXIT_USER_ERROR, main
from core.models.tiny_model import write_tiny_model


def test_bench_serve_json(tmp_path, capsys):
    path = write_tiny_model(tmp_path / "tiny")
    argv = [
        "bench",
        "serve",
        "--model",
        str(path),
        "--streams",
        "2",
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

    assert list(report)[-2:] == ["throughput_ratio_2_vs_1", "throughput_ratio_4_vs_1"]
    assert report["throughput_ratio_4_vs_1"] == report["throughput_ratio_2_vs_1"] > 0
    for key in (
        "model",
        "fingerprint",
        "machine",
        "pool_tokens",
        "rounds",
        "wall_s",
        "stream_overlap",
    ):
        assert key in report
    assert report["streams"] == 2 and report["max_tokens"] == 8
    assert set(report["tokens_per_s"]) == {"1", "2"} and all(
        v > 0 for v in report["tokens_per_s"].values()
    )
    for streams, rounds in report["rounds"].items():
        (only,) = rounds  # one repetition
        assert only["completion_tokens_each"] == [8] * int(streams)  # the tiny model never says EOS
        assert only["completion_tokens"] == 8 * int(streams) and only["wall_s"] > 0
        assert all(t > 0 for t in only["ttft_s"])
        assert only["finish_reasons"] == ["length"] * int(streams)


def test_bench_serve_table_and_bad_args(tmp_path, capsys):
    path = write_tiny_model(tmp_path / "tiny")
    argv = [
        "bench",
        "serve",
        "--model",
        str(path),
        "--streams",
        "2",
        "--max-tokens",
        "4",
        "--repeats",
        "1",
        "--data-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    assert "aggregate throughput, 2 clients / 1 client:" in capsys.readouterr().out
    assert main(argv[:4] + ["--streams", "0"] + argv[6:]) == EXIT_USER_ERROR
    assert "--streams must be at least 1" in capsys.readouterr().err
    assert (
        main(["bench", "serve", "--model", str(tmp_path / "nope"), "--data-dir", str(tmp_path)])
        == EXIT_USER_ERROR
    )
    assert "no model at" in capsys.readouterr().err


def test_bench_serve_against_mlx_lm_on_a_tiny_model(tmp_path, capsys):
    path = write_tiny_model(tmp_path / "tiny")
    argv = [
        "bench",
        "serve",
        "--against",
        "mlx-lm",
        "--model",
        str(path),
        "--streams",
        "2",
        "--max-tokens",
        "6",
        "--repeats",
        "2",
        "--json",
        "--data-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)

    assert report["against"] == "mlx_lm.server" and report["stream_counts"] == [1, 2]
    assert list(report)[-2:] == ["targets", "ratio_ours_vs_mlx_lm"] and report["targets"] == {
        "1": 1.0
    }
    for server in ("ours", "mlx_lm"):
        for streams in ("1", "2"):
            rounds = report["rounds"][server][streams]
            assert len(rounds) == 2  # one per repetition, the two servers taking turns
            assert all(r["completion_tokens_each"] == [6] * int(streams) for r in rounds)
            assert all(r["finish_reasons"] == ["length"] * int(streams) for r in rounds)
    assert report["tokens_per_s"]["ours"]["2"] > 0 and report["ratio_ours_vs_mlx_lm"]["2"] > 0


def test_bench_serve_against_mlx_lm_table(tmp_path, capsys):
    path = write_tiny_model(tmp_path / "tiny")
    argv = [
        "bench",
        "serve",
        "--against",
        "mlx-lm",
        "--model",
        str(path),
        "--streams",
        "2",
        "--max-tokens",
        "4",
        "--repeats",
        "1",
        "--data-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"model: {path}; 4 greedy tokens per request; medians of 1 repetitions, "
        "the two servers interleaved"
    )
    assert lines[1].startswith("machine: ") and "mlx-lm" in lines[1] and lines[2] == ""
    assert lines[3].split() == [
        "clients",
        "ours",
        "tok/s",
        "mlx_lm",
        "tok/s",
        "ours/mlx_lm",
        "target",
    ]
    one, two = lines[4].split(), lines[5].split()
    assert one[0] == "1" and one[3].endswith("x") and one[4] == "1.0x"  # the one-client target
    assert two[0] == "2" and two[3].endswith("x") and len(two) == 4
