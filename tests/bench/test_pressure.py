"""``radixchat bench pressure`` on a tiny model: it runs both ways, reads back, reports."""

from __future__ import annotations

import json
import threading

from core.cli.main import main
from kvcache import persist


def test_bench_pressure_json_and_summary(capsys, tiny_model, tmp_path, monkeypatch):
    # A tiny model prefills so fast that the measured rates may rightly say "compute, don't
    # read" (a CI run did); the rule has its own tests: here the disk is always read.
    monkeypatch.setattr(persist, "read_pays", lambda *rates: True)
    args = [
        "bench",
        "pressure",
        "--model",
        str(tiny_model),
        "--data-dir",
        str(tmp_path),
        "--clients",
        "4",
        "--tokens",
        "300",
        "--rounds",
        "2",
        "--repeats",
        "1",
    ]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["replies_identical"]
    # RAM holds a quarter
    assert report["pool_tokens"] < report["clients"] * report["prompt_tokens"] / 2
    disk, ram = (
        report["tokens_after_first_round"]["disk"],
        report["tokens_after_first_round"]["ram"],
    )
    assert disk["restored"] > 0 and ram["restored"] == 0  # evicted prefixes came back from disk
    assert disk["computed"] < ram["computed"]
    assert 1.0 <= report["written_vs_distinct"] < 1.5  # every distinct position at least once
    assert not list((tmp_path / "tmp").iterdir())
    assert main([*args, "--clients", "1"]) == 2
    assert "--clients" in capsys.readouterr().err


def test_bench_pressure_summary(capsys, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(persist, "read_pays", lambda *rates: True)
    assert (
        main(
            [
                "bench",
                "pressure",
                "--model",
                str(tiny_model),
                "--data-dir",
                str(tmp_path),
                "--clients",
                "4",
                "--tokens",
                "300",
                "--rounds",
                "2",
                "--repeats",
                "1",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"model: {tiny_model}") and "4 clients x 2 rounds" in lines[0]
    assert (
        lines[1].startswith("TTFT sum after round 1: disk tier ") and "(target <= 0.5)" in lines[1]
    )
    assert (
        lines[2].startswith("prompt tokens after round 1, disk tier: ") and "from disk" in lines[2]
    )
    assert lines[3].startswith("written ") and lines[3].endswith("(target <= 1.1)")
    assert lines[4] == "replies: identical both ways"


def test_bench_pressure_restores_while_the_writer_has_written_nothing(
    capsys, tiny_model, tmp_path, monkeypatch
):
    """Issue 42.6: under load (the writer at nice 19 starved) the bench restored nothing: what
    RAM evicted was on its way to disk and no restore could find it. Here the writer writes
    nothing until the bench's flush at the end: the evicted prefixes still come back, read
    from memory."""
    monkeypatch.setattr(persist, "read_pays", lambda *rates: True)
    release = threading.Event()
    do, flush = persist.DiskTier._do, persist.DiskTier.flush

    def held(self, job):
        release.wait(120)
        do(self, job)

    def released(self, timeout=None):
        release.set()
        flush(self, timeout)

    monkeypatch.setattr(persist.DiskTier, "_do", held)
    monkeypatch.setattr(persist.DiskTier, "flush", released)
    args = ["bench", "pressure", "--model", str(tiny_model), "--data-dir", str(tmp_path)]
    args += ["--clients", "4", "--tokens", "300", "--rounds", "2", "--repeats", "1", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    disk = report["tokens_after_first_round"]["disk"]
    assert disk["restored"] > 0 and report["replies_identical"]
    assert disk["computed"] < report["tokens_after_first_round"]["ram"]["computed"]
    assert 1.0 <= report["written_vs_distinct"] < 1.5  # all written in the end, once
