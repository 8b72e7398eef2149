"""``radixchat bench pull`` on a small repo: curl and the pull both run, medians and the
resume's bytes come back (the figures themselves are the benchmark's, never asserted)."""

from __future__ import annotations

import json
import shutil

import pytest

from core.cli.main import EXIT_USER_ERROR, main


@pytest.mark.skipif(shutil.which("curl") is None, reason="the benchmark compares with curl")
def test_bench_pull_json(tmp_path, capsys, monkeypatch):
    # the resume sets them in this process
    for name in ("HF_ENDPOINT", "HF_HUB_CACHE", "HF_HUB_DISABLE_XET"):
        monkeypatch.setenv(name, "unset")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main(["bench", "pull", "--mb", "4", "--repeats", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)

    assert report["file_bytes"] == 4 << 20 and report["repeats"] == 1
    assert len(report["curl_s"]) == len(report["pull_s"]) == len(report["pull_download_s"]) == 1
    assert report["pull_median_s"] == report["pull_s"][0] > report["pull_download_s"][0] > 0
    assert report["pull_vs_curl"] == pytest.approx(
        report["curl_median_s"] / report["pull_median_s"]
    )
    assert report["curl_cpu_median_s"] > 0 and report["pull_cpu_median_s"] > 0
    assert len(report["load_average_before"]) == 3 and report["cpus"] >= 1
    # the resume asked for what was missing, and only that
    assert 0 < report["resume_kept_bytes"] < report["file_bytes"]
    assert (
        report["resume_served_bytes"]
        == report["resume_missing_bytes"]
        == report["resume_fetched_bytes"]
    )
    assert report["resume_kept_bytes"] + report["resume_missing_bytes"] == report["file_bytes"]


def test_bench_pull_needs_sizes(capsys):
    assert main(["bench", "pull", "--mb", "0"]) == EXIT_USER_ERROR
    assert "at least 1" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("curl") is None, reason="the benchmark compares with curl")
def test_bench_pull_table(tmp_path, capsys, monkeypatch):
    for name in ("HF_ENDPOINT", "HF_HUB_CACHE", "HF_HUB_DISABLE_XET"):
        monkeypatch.setenv(name, "unset")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main(["bench", "pull", "--mb", "2", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "file: 2 MB, median of 1"
    assert (
        lines[1].startswith("curl -o FILE URL:") and lines[1].endswith(" s)") and "MB/s" in lines[1]
    )
    assert lines[2].startswith("radixchat pull (command):") and lines[2].endswith("% of curl")
    assert lines[3].startswith("radixchat pull (download):") and lines[3].endswith("% of curl")
    assert any(
        line.startswith("CPU time (user+sys, median): curl ") and "load average" in line
        for line in lines
    )
    assert lines[-1].startswith("resume after a cancel at ") and "were missing" in lines[-1]
