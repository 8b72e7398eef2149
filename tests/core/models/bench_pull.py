"""Benchmark (not a test): ``radixchat pull`` of a ~500 MB repo from the loopback hub
against a plain ``curl`` of the same file from the same server, and a resumed pull.

    python -m tests.core.models.bench_pull [--mb 500] [--repeats 3] [--json]

Each repetition starts from an empty HF cache. Reported: the median wall time of
``curl -o FILE URL`` (the weights file alone), of the whole ``radixchat pull REPO``
command (a new Python process: imports, hub API calls, every file, SHA-256 while
writing, linking), and of the download inside it (PullResult.seconds); the pull's rate
as a share of curl's; the CPU time of each (the figure a loaded machine does not
blur). Then a pull cancelled half-way and resumed: the bytes the server
sent for the resume against the bytes that were missing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.core.models.hub_fixture import LoopbackHub

REPO = "bench/Big-Model"
WEIGHTS = "model.safetensors"


def make_repo(folder: Path, megabytes: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "tokenizer.json").write_text("{}")
    block = os.urandom(1 << 20)
    with open(folder / WEIGHTS, "wb") as f:
        for i in range(megabytes):
            f.write(block[i % 7:] + block[:i % 7])  # distinct blocks, so a wrong offset shows in the hash
    return folder


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-pull-"))
    hub = LoopbackHub()
    try:
        source = make_repo(work / "source", args.mb)
        hub.add_folder(REPO, source, tags=["mlx"])
        size = (source / WEIGHTS).stat().st_size
        url = f"{hub.url}/{REPO}/resolve/main/{WEIGHTS}"
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "PYTHONPATH": os.getcwd()}
        curl_s, pull_s, transfer_s, curl_cpu, pull_cpu = [], [], [], [], []
        for i in range(args.repeats):
            target = work / f"curl-{i}.bin"
            started, cpu = time.perf_counter(), _children_cpu()
            subprocess.run(["curl", "-sSf", "-o", str(target), url], check=True)
            curl_s.append(time.perf_counter() - started)
            curl_cpu.append(_children_cpu() - cpu)
            assert target.stat().st_size == size
            target.unlink()

            cache = work / f"hf-{i}"
            started, cpu = time.perf_counter(), _children_cpu()
            out = subprocess.run([sys.executable, "-m", "core.cli.main", "pull", REPO, "--data-dir",
                                  str(work / f"data-{i}")], env={**env, "HF_HUB_CACHE": str(cache)},
                                 check=True, capture_output=True, text=True)
            pull_s.append(time.perf_counter() - started)
            pull_cpu.append(_children_cpu() - cpu)
            transfer_s.append(float(out.stderr.rsplit(" in ", 1)[1].split(" s;")[0]))
            shutil.rmtree(cache)
        resumed = _resume(hub, work, size)
    finally:
        hub.close()
        shutil.rmtree(work, ignore_errors=True)
    curl, pull, transfer = (statistics.median(x) for x in (curl_s, pull_s, transfer_s))
    return {
        "file_bytes": size, "repeats": args.repeats,
        "curl_s": curl_s, "pull_command_s": pull_s, "pull_download_s": transfer_s,
        "curl_MBps": size / curl / 1e6, "pull_command_MBps": size / pull / 1e6,
        "pull_download_MBps": size / transfer / 1e6,
        "command_vs_curl": curl / pull, "download_vs_curl": curl / transfer,
        "curl_cpu_s": statistics.median(curl_cpu), "pull_cpu_s": statistics.median(pull_cpu),
        "load_average": os.getloadavg()[0], "cpus": os.cpu_count(),
        **resumed,
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _resume(hub: LoopbackHub, work: Path, size: int) -> dict:
    """Cancel a pull half-way (in this process), then resume it; count what the server sent."""
    os.environ.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HUB_CACHE=str(work / "hf-resume"))
    from core.models import download

    cancel = threading.Event()
    try:
        download.pull(REPO, cancel=cancel, progress=lambda p: cancel.set() if p.done_bytes > size // 2 else None)
    except download.DownloadCancelled:
        pass
    hub.wait_idle()
    partial = next((work / "hf-resume").glob(f"models--*/blobs/*{download.PARTIAL_SUFFIX}"))
    kept = partial.stat().st_size
    before = hub.served(REPO, WEIGHTS)
    result = download.pull(REPO)
    return {"resume_kept_bytes": kept, "resume_missing_bytes": size - kept,
            "resume_served_bytes": hub.served(REPO, WEIGHTS) - before, "resume_fetched_bytes": result.fetched_bytes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"file: {report['file_bytes'] / 1e6:,.0f} MB, median of {report['repeats']}")
    print(f"curl -o FILE URL:           {report['curl_MBps']:8,.0f} MB/s  {_runs(report['curl_s'])}")
    print(f"radixchat pull (command):   {report['pull_command_MBps']:8,.0f} MB/s  {_runs(report['pull_command_s'])}"
          f"  = {report['command_vs_curl'] * 100:.0f}% of curl")
    print(f"radixchat pull (download):  {report['pull_download_MBps']:8,.0f} MB/s  {_runs(report['pull_download_s'])}"
          f"  = {report['download_vs_curl'] * 100:.0f}% of curl")
    print(f"CPU time (user+sys, median): curl {report['curl_cpu_s']:.2f} s, radixchat pull {report['pull_cpu_s']:.2f} s"
          f" (SHA-256 of every byte, Python); load average {report['load_average']:.1f} on {report['cpus']} CPUs")
    print(f"resume after a cancel at {report['resume_kept_bytes'] / 1e6:,.0f} MB: the server sent "
          f"{report['resume_served_bytes']:,} bytes, {report['resume_missing_bytes']:,} were missing")
    return 0


def _runs(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:.2f} s" for v in values) + ")"


if __name__ == "__main__":
    sys.exit(main())
