"""``radixchat bench pull``: ``radixchat pull`` of a repo with one large weights file from
a loopback hub, against a plain ``curl`` of the same file from the same server.

Each repetition runs ``curl -o FILE URL`` (the weights file alone), then the whole
``radixchat pull REPO`` command in a new Python process (start-up and imports, the hub's
metadata, every file of the model, SHA-256 while writing, linking into the HF cache),
into an empty HF cache, run as an installed copy runs: a byte-compiled copy of ``core``,
with an HF_HOME of its own, where the first pull keeps the hub's registry of AI agents
for a day as huggingface_hub does (see :func:`_as_installed`). Reported: the median wall
time of each, the pull's download alone (PullResult.seconds, as the command prints it),
the ratio of rates (curl's median time / the pull's), curl followed by ``openssl dgst
-sha256`` of its file (the same work as a verified download, for reference: curl checks
nothing), the CPU time of each (user + system, the figure a loaded machine blurs least),
and the load average before and after. Then a pull cancelled half-way and resumed: the
bytes the server sent for the resume against the bytes that were missing.

The loopback hub is the test suite's (``tests/core/models/hub/hub_fixture.py``): a test
double with fault injection, not part of the product, so it is not shipped under
``core/``. This benchmark imports it when it runs from a source checkout and says so
otherwise. The repo it serves looks as the hub shows an MLX repo (its config in the
model's metadata), so the pull takes the path a real one takes.
"""

from __future__ import annotations

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

from core.errors import UserError

REPO = "bench/Big-Model-4bit"
WEIGHTS = "model.safetensors"


def run_bench_pull(args) -> int:
    if args.mb < 1 or args.repeats < 1:
        raise UserError("--mb and --repeats must be at least 1")
    if shutil.which("curl") is None:
        raise UserError("radixchat bench pull compares with curl, which is not installed")
    fixture = _loopback_hub_module()
    report = measure(fixture, args.mb, args.repeats)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
    return 0


def _loopback_hub_module():
    try:
        from tests.core.models.hub import hub_fixture
    except ImportError:
        raise UserError(
            "radixchat bench pull runs from a source checkout: it serves the model from the test "
            "suite's loopback hub (tests/core/models/hub/hub_fixture.py, which needs pytest)"
        ) from None
    return hub_fixture


def make_repo(folder: Path, megabytes: int) -> Path:
    """config.json, tokenizer.json and ``megabytes`` MiB of weights (no two MiB alike, so
    a byte at a wrong offset fails the hash)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "tokenizer.json").write_text("{}")
    block = os.urandom(1 << 20)
    with open(folder / WEIGHTS, "wb") as f:
        for i in range(megabytes):
            f.write(block[i % 7 :] + block[: i % 7])
    return folder


def measure(fixture, megabytes: int, repeats: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-pull-"))
    hub = fixture.LoopbackHub()
    load_before = os.getloadavg()
    try:
        source = make_repo(work / "source", megabytes)
        size = (source / WEIGHTS).stat().st_size
        repo = hub.add_folder(
            REPO,
            source,
            tags=["mlx", "safetensors"],
            library_name="mlx",
            config={"model_type": "llama"},
        )
        url = f"{hub.url}/{REPO}/resolve/main/{WEIGHTS}"
        checkout = Path(fixture.__file__).resolve().parents[4]
        env = {
            **os.environ,
            "HF_ENDPOINT": hub.url,
            "HF_HUB_DISABLE_XET": "1",
            "PYTHONPATH": os.pathsep.join(
                filter(None, (str(checkout), os.environ.get("PYTHONPATH")))
            ),
        }
        env.pop("HF_HUB_OFFLINE", None)
        pull_env = _as_installed(env, checkout, work)
        # as the hub answers it: the first pull keeps it in HF_HOME
        hub.agent_registry = fixture.AGENT_REGISTRY
        openssl = shutil.which("openssl")
        runs: dict[str, list[float]] = {
            k: []
            for k in (
                "curl_s",
                "curl_cpu_s",
                "pull_s",
                "pull_cpu_s",
                "pull_download_s",
                "curl_then_sha256_s",
            )
        }
        for i in range(repeats):
            target = work / f"curl-{i}.bin"
            seconds, cpu, _ = _timed(["curl", "-sSf", "-o", str(target), url], env)
            if target.stat().st_size != size:
                raise UserError(f"curl fetched {target.stat().st_size:,} of {size:,} bytes")
            runs["curl_s"].append(seconds)
            runs["curl_cpu_s"].append(cpu)
            if openssl:
                hashing, _, out = _timed([openssl, "dgst", "-sha256", str(target)], env)
                if repo.files[WEIGHTS].sha256 not in out.stdout:
                    raise UserError(
                        f"curl's copy does not hash as the hub lists: {out.stdout.strip()}"
                    )
                runs["curl_then_sha256_s"].append(seconds + hashing)
            target.unlink()

            cache = work / f"hf-{i}"
            seconds, cpu, out = _timed(
                [
                    sys.executable,
                    "-m",
                    "core.cli.main",
                    "pull",
                    REPO,
                    "--data-dir",
                    str(work / f"data-{i}"),
                ],
                {**pull_env, "HF_HUB_CACHE": str(cache)},
                work,
            )
            runs["pull_s"].append(seconds)
            runs["pull_cpu_s"].append(cpu)
            runs["pull_download_s"].append(_download_seconds(out.stderr))
            shutil.rmtree(cache)
        hub.agent_registry = None  # this process's HF_HOME is the user's: it keeps no loopback copy
        resumed = _resume(hub, work, size, env)
        served_total = repo.files[WEIGHTS].size
    finally:
        hub.close()
        shutil.rmtree(work, ignore_errors=True)
    curl, pull, download = (
        statistics.median(runs[k]) for k in ("curl_s", "pull_s", "pull_download_s")
    )
    return {
        "file_bytes": served_total,
        "repeats": repeats,
        **runs,
        "curl_median_s": curl,
        "pull_median_s": pull,
        "pull_download_median_s": download,
        "curl_MBps": size / curl / 1e6,
        "pull_MBps": size / pull / 1e6,
        "pull_download_MBps": size / download / 1e6,
        "pull_vs_curl": curl / pull,
        "download_vs_curl": curl / download,
        "curl_then_sha256_median_s": statistics.median(runs["curl_then_sha256_s"])
        if openssl
        else None,
        "pull_vs_curl_then_sha256": statistics.median(runs["curl_then_sha256_s"]) / pull
        if openssl
        else None,
        "curl_cpu_median_s": statistics.median(runs["curl_cpu_s"]),
        "pull_cpu_median_s": statistics.median(runs["pull_cpu_s"]),
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        "cpus": os.cpu_count(),
        **resumed,
    }


def _as_installed(env: dict, checkout: Path, work: Path) -> dict:
    """The pull's environment: a copy of the checkout's ``core`` package, byte-compiled, as
    pip and PyInstaller install it (the pull from the checkout compiled RadixChat's modules
    at every start where PYTHONDONTWRITEBYTECODE is set, as in this project's sessions: no
    installed copy does; the Python library's own bytecode is used as it is), and an
    HF_HOME of its own, where huggingface_hub keeps the hub's registry of AI agents for a
    day (the first pull fetches it). The pull runs in ``work``, so the checkout is not on
    its path."""
    installed = work / "installed"
    shutil.copytree(
        checkout / "core", installed / "core", ignore=shutil.ignore_patterns("__pycache__")
    )
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(installed)], check=True, capture_output=True
    )
    return {**env, "PYTHONPATH": str(installed), "HF_HOME": str(work / "hf-home")}


def _timed(
    command: list[str], env: dict, cwd: Path | None = None
) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU seconds (user + system) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise UserError(
            f"{command[0]} failed ({out.returncode}): {(out.stderr or out.stdout).strip()[-300:]}"
        )
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, out


def _download_seconds(stderr: str) -> float:
    """The download's own time, from the line ``radixchat pull`` ends with
    ("fetched N MB in S s; ...")."""
    try:
        return max(float(stderr.rsplit(" in ", 1)[1].split(" s;")[0]), 0.01)  # printed to 0.01 s
    except (IndexError, ValueError):
        raise UserError(
            f"radixchat pull did not say how long it took: {stderr.strip()[-200:]}"
        ) from None


def _resume(hub, work: Path, size: int, env: dict) -> dict:
    """Cancel a pull half-way (in this process), then resume it; count what the server sent."""
    os.environ.update(
        HF_ENDPOINT=env["HF_ENDPOINT"], HF_HUB_DISABLE_XET="1", HF_HUB_CACHE=str(work / "hf-resume")
    )
    os.environ.pop("HF_HUB_OFFLINE", None)
    from core.models.hub import download

    cancel = threading.Event()
    # bytes/s for this pull only: progress comes often enough to cancel mid-file
    hub.rate = size / 2.0
    try:
        download.pull(
            REPO,
            cancel=cancel,
            progress=lambda p: cancel.set() if p.done_bytes > size // 2 else None,
        )
    except download.DownloadCancelled:
        pass
    finally:
        hub.rate = None
    hub.wait_idle()
    partial = next((work / "hf-resume").glob(f"models--*/blobs/*{download.PARTIAL_SUFFIX}"), None)
    if partial is None:
        raise UserError("the pull to resume was not cancelled half-way: nothing to resume")
    kept = partial.stat().st_size
    before = hub.served(REPO, WEIGHTS)
    result = download.pull(REPO)
    return {
        "resume_kept_bytes": kept,
        "resume_missing_bytes": size - kept,
        "resume_served_bytes": hub.served(REPO, WEIGHTS) - before,
        "resume_fetched_bytes": result.fetched_bytes,
    }


def print_report(r: dict) -> None:
    print(f"file: {r['file_bytes'] / 1e6:,.0f} MB, median of {r['repeats']}")
    print(f"curl -o FILE URL:          {r['curl_MBps']:8,.0f} MB/s  {_runs(r['curl_s'])}")
    print(
        f"radixchat pull (command):  {r['pull_MBps']:8,.0f} MB/s  {_runs(r['pull_s'])}"
        f"  = {r['pull_vs_curl'] * 100:.0f}% of curl"
    )
    print(
        f"radixchat pull (download): {r['pull_download_MBps']:8,.0f} MB/s  "
        f"{_runs(r['pull_download_s'])}  = {r['download_vs_curl'] * 100:.0f}% of curl"
    )
    if r["curl_then_sha256_median_s"] is not None:
        print(
            "curl, then openssl dgst -sha256: "
            f"{r['file_bytes'] / r['curl_then_sha256_median_s'] / 1e6:,.0f} MB/s  "
            f"{_runs(r['curl_then_sha256_s'])}  (the same work as a verified pull: the pull runs "
            f"at {r['pull_vs_curl_then_sha256'] * 100:.0f}% of it)"
        )
    print(
        f"CPU time (user+sys, median): curl {r['curl_cpu_median_s']:.2f} s, radixchat pull "
        f"{r['pull_cpu_median_s']:.2f} s; load average {r['load_average_before'][0]:.1f} before, "
        f"{r['load_average_after'][0]:.1f} after, on {r['cpus']} CPUs"
    )
    print(
        f"resume after a cancel at {r['resume_kept_bytes'] / 1e6:,.0f} MB: the server sent "
        f"{r['resume_served_bytes']:,} bytes, {r['resume_missing_bytes']:,} were missing"
    )


def _runs(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:.2f} s" for v in values) + ")"
