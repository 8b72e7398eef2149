"""``radixchat bench soak``: a server under eight clients for ``--minutes``, restarted half
way, watched for leaks, for stores outgrowing their budgets, for server errors and for
replies the cache changed (issue 42).

On loopback, in a scratch folder removed at the end (the models linked from the data
folder), two ``radixchat serve`` processes on the same model: the one under test, with three
API keys and a small ``--disk-budget`` so the stores fill and evict within the run, and a
reference started with ``--no-cache``. Eight clients (bench/soak_clients.py) of the
three dialects (OpenAI chat completions, Anthropic messages, OpenAI Responses with stored
chains and conversations) through the ``openai`` and ``anthropic`` packages, with tools,
streams, streams dropped after a few events, every request with a timeout. Half way the
server is stopped (SIGTERM) and started again on the same data folder; what failed while it
was down is counted apart and sent again. A sample of greedy turns is sent to the reference
too, and the replies compared.

Every ``--sample-s`` (15 s): the server's RSS and open descriptors (psutil), the bytes on
disk of each store (``kvcache.db``, ``responses.db``, ``chats.db``, each with its
write-ahead log) and what each store counts against its budget (the KV pages; the stored
responses, by key), and the requests so far. The targets: RSS flat within 5 % after the
warm-up (the median of the last minute's samples against the median of the minute before
the 10th; a run shorter than 30 minutes warms up for its first third), every store within
its budget, no 5xx, no mismatched reply.
"""

from __future__ import annotations

import json
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.harness import link_models
from bench.server_process import ServerProcess, free_port, radixchat_server_code
from bench.soak_clients import (
    KEYS,
    MIRROR_KEY,
    MIRRORS,
    PLANS,
    Mirror,
    Restart,
    SoakClient,
    Tally,
)
from bench.soak_wire import Clients, Step
from core import paths
from core.engine import namespaces
from core.errors import UserError
from core.models.derived import derived_bytes

TARGET_RSS_DRIFT = 0.05
WARMUP_S = 600.0  # RSS is flat from here on (a shorter run: its first third)
WINDOW_S = 60.0  # the samples whose median is taken, at the warm-up's end and at the run's
STORE_FILES = {
    "kvcache": ("kvcache.db", "kvcache.db-wal"),
    "responses": ("responses.db", "responses.db-wal"),
    "chats": ("chats.db", "chats.db-wal"),
}


@dataclass
class Sample:
    t_s: float  # since the clients started
    process: int  # 1: the server before the restart; 2: after
    rss_bytes: int
    open_fds: int  # descriptors: files, sockets, pipes
    open_files: int  # regular files among them
    disk_bytes: dict[str, int]  # a store's file and its write-ahead log, by file name
    counted_bytes: dict[str, int]  # what each store counts against its budget
    requests: int
    failed: int


@dataclass
class Budgets:
    """The bounds the stores must keep (``core.paths``' arithmetic, as the engine does it)."""

    disk: int  # the data folder's, --disk-budget
    responses: int  # the stored responses' share of it
    per_key: int  # one key's share of that
    kvcache: list[int]  # the KV disk cache's, as each server process measured it at load


def _store_sizes(data: Path) -> dict[str, int]:
    sizes = {}
    for files in STORE_FILES.values():
        for name in files:
            try:
                sizes[name] = (data / name).stat().st_size
            except OSError:
                sizes[name] = 0
    return sizes


def _query(path: Path, sql: str) -> list[tuple]:
    """``sql`` on a store, read-only (an absent or busy store: nothing)."""
    if not path.exists():
        return []
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return []
    try:
        return db.execute(sql).fetchall()
    except sqlite3.Error:
        return []
    finally:
        db.close()


def _counted(data: Path, owners: dict[str, str]) -> dict[str, int]:
    """The KV pages' bytes, and the stored responses' (all, and each key's), as the stores
    count them against their budgets."""
    counted = {}
    kv = _query(paths.kv_cache_db_path(data), "SELECT coalesce(sum(nbytes), 0) FROM pages")
    counted["kvcache"] = kv[0][0] if kv else 0
    for store, path in (
        ("kvcache", paths.kv_cache_db_path(data)),
        ("responses", paths.responses_db_path(data)),
    ):  # pages inside the file SQLite reuses before it grows the file
        free = _query(path, "SELECT * FROM pragma_freelist_count, pragma_page_size")
        counted[f"{store}:free"] = free[0][0] * free[0][1] if free else 0
    rows = _query(
        paths.responses_db_path(data),
        "SELECT owner, sum(bytes) FROM (SELECT owner, bytes FROM responses UNION ALL "
        "SELECT owner, bytes FROM conversations) GROUP BY owner",
    )
    counted["responses"] = sum(size for _, size in rows)
    for owner, size in rows:
        counted[f"responses:{owners.get(owner, owner)}"] = size
    return counted


class Watch:
    """Samples the server under test every ``interval_s`` (its process, the data folder)."""

    def __init__(self, data: Path, interval_s: float, tally: Tally):
        self.data, self.interval_s, self.tally = data, interval_s, tally
        self.samples: list[Sample] = []
        self.owners = {namespaces.owner(namespaces.for_key(k)): k.split("-")[2] for k in KEYS}
        self.started = time.monotonic()

    def sample(self, pid: int | None, process: int) -> None:
        import psutil

        if pid is None:
            return
        try:
            proc = psutil.Process(pid)
            rss, fds, files = proc.memory_info().rss, proc.num_fds(), len(proc.open_files())
        except psutil.Error:
            return  # it is stopping
        requests, failed = self.tally.requests()
        sample = Sample(
            round(time.monotonic() - self.started, 1),
            process,
            rss,
            fds,
            files,
            _store_sizes(self.data),
            _counted(self.data, self.owners),
            requests,
            failed,
        )
        self.samples.append(sample)
        print(_progress(sample), file=sys.stderr, flush=True)  # a run of an hour shows it lives


def _mb(n: float) -> str:
    return f"{n / paths.MB:.1f} MB"


def _progress(s: Sample) -> str:
    disk = s.disk_bytes
    return (
        f"radixchat: bench soak: {int(s.t_s) // 60}:{int(s.t_s) % 60:02d} "
        f"RSS {_mb(s.rss_bytes)}, {s.open_fds} fds; kvcache {_mb(disk['kvcache.db'])} "
        f"+ WAL {_mb(disk['kvcache.db-wal'])}, responses {_mb(disk['responses.db'])} "
        f"+ WAL {_mb(disk['responses.db-wal'])}; {s.requests} requests, {s.failed} failed"
    )


def _start_servers(cached: ServerProcess, plain: ServerProcess) -> None:
    """Both at once (each loads the model)."""
    failure: list[BaseException] = []

    def start_plain() -> None:
        try:
            plain.start()
        except BaseException as exc:  # raised again below, on this thread
            failure.append(exc)

    helper = threading.Thread(target=start_plain, name="soak-start-reference")
    helper.start()
    try:
        cached.start()
    finally:
        helper.join()
    if failure:
        raise failure[0]


def _warm_up(port: int, key: str, timeout_s: float) -> None:
    """One short request: a model's first forward compiles what later ones reuse."""
    clients = Clients(port, key, timeout_s)
    try:
        clients.perform(
            Step(
                "chat",
                {
                    "model": "default",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 2,
                    "temperature": 0,
                },
            )
        )
    finally:
        clients.close()


def _kv_budget(data: Path, disk: int, responses: int) -> int:
    """The KV disk cache's budget as the server worked it out at its load (``Engine``):
    ``responses`` is what the stored responses took then (measured before it started)."""
    return max(disk - derived_bytes(data) - responses, disk // 4)


def _folder(scratch: Path, name: str, root: Path) -> Path:
    data = scratch / name
    data.mkdir()
    link_models(root, data)
    if (root / "file_hashes.json").exists():  # the model file's hash, known already
        shutil.copy(root / "file_hashes.json", data / "file_hashes.json")
    return data


def run_bench_soak(args) -> int:
    if not args.minutes > 0:
        raise UserError("--minutes must be more than 0")
    if not 0 <= args.mirror_share <= 1:
        raise UserError("--mirror-share must be between 0 and 1")
    if not (args.sample_s > 0 and args.request_timeout_s > 0 and args.disk_budget_mb >= 1):
        raise UserError(
            "--sample-s and --request-timeout-s must be more than 0, --disk-budget-mb 1 at least"
        )
    root = paths.data_dir(args.data_dir)
    disk = round(args.disk_budget_mb * paths.MB)
    responses = paths.stored_responses_budget(disk)
    budgets = Budgets(disk, responses, responses // len(KEYS), [])
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="radixchat-soak-")))
        data, plain_data = _folder(scratch, "cached", root), _folder(scratch, "uncached", root)
        port, plain_port = free_port(), free_port()
        cached = ServerProcess(
            "radixchat serve",
            radixchat_server_code(
                args.model,
                data,
                port,
                args.kv_tokens,
                extra=[a for key in KEYS for a in ("--api-key", key)]
                + ["--disk-budget", repr(disk / paths.GB)],
            ),
            port,
            ready_path="/health",
        )
        plain = ServerProcess(
            "radixchat serve --no-cache",
            radixchat_server_code(
                args.model,
                plain_data,
                plain_port,
                args.kv_tokens,
                use_cache=False,
                extra=["--api-key", MIRROR_KEY],
            ),
            plain_port,
            ready_path="/health",
        )
        stack.callback(plain.stop)
        stack.callback(cached.stop)
        responses_at_load = paths.stored_responses_bytes(data, disk)
        _start_servers(cached, plain)
        _warm_up(port, KEYS[0], args.request_timeout_s)
        _warm_up(plain_port, MIRROR_KEY, args.request_timeout_s)
        budgets.kvcache.append(_kv_budget(data, disk, responses_at_load))
        run = _Run(args, cached, data, budgets)
        run.drive(plain_port)
        at_rest = _store_sizes(data)
        derived = derived_bytes(data)
    report = _report(args, run, budgets, at_rest, derived)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    return 0


class _Run:
    """The clients against the server under test for ``--minutes``, its restart half way,
    and the samples taken meanwhile."""

    def __init__(self, args, server: ServerProcess, data: Path, budgets: Budgets):
        self.args, self.server, self.data, self.budgets = args, server, data, budgets
        self.run_s = args.minutes * 60
        self.tally, self.restart = Tally(), Restart()
        self.watch = Watch(data, args.sample_s, self.tally)
        self.stops: list[dict] = []  # the restart's stop, then the last
        self.logs: list[str] = []  # what the server printed, each process

    def drive(self, plain_port: int) -> None:
        args, timeout_s = self.args, self.args.request_timeout_s
        deadline = self.watch.started + self.run_s
        mirrors = [Mirror(plain_port, MIRROR_KEY, timeout_s, self.tally) for _ in range(MIRRORS)]
        clients = [
            SoakClient(
                i,
                plan,
                self.server.port,
                timeout_s,
                deadline,
                args.max_tokens,
                args.mirror_share,
                self.tally,
                self.restart,
                mirrors[i % MIRRORS],
            )
            for i, plan in enumerate(PLANS)
        ]
        for thread in (*mirrors, *clients):
            thread.start()
        try:
            self._watch_until(deadline)
        finally:
            for client in clients:  # on an error too: no client outlives the run
                client.deadline = 0.0
            self.restart.up.set()
            for client in clients:  # the requests in flight end, each within its timeout
                client.join(timeout_s + 30)
            stop_by = time.monotonic() + timeout_s
            for mirror in mirrors:
                mirror.finish(stop_by)
            for mirror in mirrors:
                mirror.join(max(0.0, stop_by - time.monotonic()) + timeout_s + 30)
        self.logs.append(self.server.output())
        self.stops.append(_stop(self.server))

    def _watch_until(self, deadline: float) -> None:
        process, restart_at = 1, self.watch.started + self.run_s / 2
        while (now := time.monotonic()) < deadline:
            if process == 1 and now >= restart_at:
                self._restart()
                process = 2
                continue
            self.watch.sample(self.server.pid, process)
            next_at = min(deadline, now + self.args.sample_s)
            if process == 1:
                next_at = min(next_at, restart_at)
            time.sleep(max(0.0, next_at - time.monotonic()))
        self.watch.sample(self.server.pid, process)

    def _restart(self) -> None:
        """Stop the server cleanly and start it again on the same data folder and port."""
        self.logs.append(self.server.output())
        self.restart.begin()
        self.stops.append(_stop(self.server))
        disk = self.budgets.disk
        responses_at_load = paths.stored_responses_bytes(self.data, disk)
        self.server.start()
        self.restart.end()
        self.stops[-1]["down_s"] = round(self.restart.ended - self.restart.began, 2)
        self.budgets.kvcache.append(_kv_budget(self.data, disk, responses_at_load))


def _stop(server: ServerProcess) -> dict:
    """Stop the server (SIGTERM): how it ended and how long it took."""
    began = time.monotonic()
    status = server.stop()
    return {"exit_status": status, "stop_s": round(time.monotonic() - began, 2)}


def _median_of(samples: list[Sample], start: float, end: float) -> float | None:
    rss = [s.rss_bytes for s in samples if start <= s.t_s <= end]
    return statistics.median(rss) if rss else None


def _drift(samples: list[Sample], start: float, end: float, sample_s: float) -> dict:
    """RSS at the end of [start, end] against after its warm-up (WARMUP_S from ``start``,
    or its first third), medians over a window of samples."""
    span = end - start
    warmup = min(WARMUP_S, span / 3)
    window = max(min(WINDOW_S, span / 10), sample_s)
    reference = _median_of(samples, start + warmup - window, start + warmup)
    last = _median_of(samples, end - window, end + sample_s)
    drift = None if not reference or last is None else last / reference - 1
    return {
        "warmup_s": warmup,
        "window_s": window,
        "reference_bytes": reference,
        "end_bytes": last,
        "drift": None if drift is None else round(drift, 4),
    }


def _rss(samples: list[Sample], run_s: float, sample_s: float) -> dict:
    """RSS flat after the warm-up, judged in each server process (the one after the restart
    from its own start: a fresh process is not the first one grown), the whole run's drift
    (the first process's warm-up against the second's end) reported beside. The run ends at
    its last sample where that came after ``run_s`` (a restart slower than the run's second
    half, on a busy machine)."""
    end = max(run_s, samples[-1].t_s) if samples else run_s
    whole = _drift(samples, 0.0, end, sample_s)
    processes = []
    for number in sorted({s.process for s in samples}):
        mine = [s for s in samples if s.process == number]
        first, last = mine[0].t_s, (mine[-1].t_s if number != samples[-1].process else end)
        processes.append(
            {"process": number, "started_s": first, **_drift(mine, first, last, sample_s)}
        )
    drifts = [p["drift"] for p in processes]
    return {
        **whole,
        "processes": processes,
        "target": TARGET_RSS_DRIFT,
        "within": bool(drifts)
        and all(d is not None and abs(d) <= TARGET_RSS_DRIFT for d in drifts),
        "max_bytes": max((s.rss_bytes for s in samples), default=None),
        "open_fds_max": max((s.open_fds for s in samples), default=None),
        "open_fds_end": samples[-1].open_fds if samples else None,
    }


def _stores(samples: list[Sample], budgets: Budgets, at_rest: dict[str, int], derived: int) -> dict:
    def disk_max(store: str, process: int | None = None) -> int:
        return max(
            (
                sum(s.disk_bytes[f] for f in STORE_FILES[store])
                for s in samples
                if process is None or s.process == process
            ),
            default=0,
        )

    def counted_max(name: str, process: int | None = None) -> int:
        return max(
            (
                s.counted_bytes.get(name, 0)
                for s in samples
                if process is None or s.process == process
            ),
            default=0,
        )

    kv_counted = [counted_max("kvcache", p + 1) for p in range(len(budgets.kvcache))]
    kv_disk = [disk_max("kvcache", p + 1) for p in range(len(budgets.kvcache))]
    keys = {k.split("-")[2]: counted_max(f"responses:{k.split('-')[2]}") for k in KEYS}
    folder_max = max((sum(s.disk_bytes.values()) + derived for s in samples), default=derived)
    stores = {
        "kvcache": {
            "budget_bytes": budgets.kvcache,  # at each load: before the restart, after it
            "counted_max_bytes": max(kv_counted, default=0),
            "disk_max_bytes": disk_max("kvcache"),
            "free_in_file_max_bytes": counted_max("kvcache:free"),
            "at_rest_bytes": sum(at_rest[f] for f in STORE_FILES["kvcache"]),
            # the files (the database, its log), not only the pages counted
            "within": all(
                max(c, d) <= b for c, d, b in zip(kv_counted, kv_disk, budgets.kvcache, strict=True)
            ),
        },
        "responses": {
            "budget_bytes": budgets.responses,
            "per_key_budget_bytes": budgets.per_key,
            "counted_max_bytes": counted_max("responses"),
            "per_key_counted_max_bytes": keys,
            "disk_max_bytes": disk_max("responses"),
            "at_rest_bytes": sum(at_rest[f] for f in STORE_FILES["responses"]),
            # its budget counts UTF-8 bytes; its files are within the data folder's
            "within": counted_max("responses") <= budgets.responses
            and all(v <= budgets.per_key for v in keys.values()),
        },
        "chats": {
            "budget_bytes": None,  # the data folder's reserve keeps room for the chats
            "disk_max_bytes": disk_max("chats"),
            "at_rest_bytes": sum(at_rest[f] for f in STORE_FILES["chats"]),
            "within": True,
        },
        "data_folder": {
            "budget_bytes": budgets.disk,
            "disk_max_bytes": folder_max,
            "derived_bytes": derived,
            "within": folder_max <= budgets.disk,
        },
    }
    return stores


def _server_log(logs: list[str]) -> dict:
    lines = [line for text in logs for line in text.splitlines()]
    notable = [
        line
        for line in lines
        if any(word in line for word in ("Traceback", "ERROR", "Error", "WARNING", "warning"))
    ]
    return {"lines": len(lines), "notable": len(notable), "notable_last": notable[-5:]}


def _report(args, run: _Run, budgets: Budgets, at_rest: dict[str, int], derived: int) -> dict:
    samples, stops = run.watch.samples, run.stops
    requests = run.tally.report()
    rss = _rss(samples, run.run_s, args.sample_s)
    stores = _stores(samples, budgets, at_rest, derived)
    targets = {
        "rss_flat": rss["within"],
        "stores_within_budget": all(store["within"] for store in stores.values()),
        "no_5xx": requests["server_errors"] == 0,
        "no_mismatches": requests["mismatches"] == 0 and requests["replies_compared"] > 0,
    }
    return {
        "model": args.model,
        "machine": platform.platform(),
        "minutes": args.minutes,
        "requests_per_minute": round(requests["requests"] / args.minutes, 1),
        "clients": [asdict(plan) for plan in PLANS],
        "keys": len(KEYS),
        "max_tokens": args.max_tokens,
        "restart": stops[0] if len(stops) > 1 else None,
        "final_stop": stops[-1],
        "requests": requests,
        "rss": rss,
        "stores": stores,
        "server_log": _server_log(run.logs),
        "targets": targets,
        "passed": all(targets.values()),
        "samples": [asdict(s) for s in samples],
    }


def _print_report(report: dict) -> None:
    out = sys.stdout
    req = report["requests"]
    print(
        f"Soak of {Path(report['model']).name}: {report['minutes']:g} min, "
        f"{len(report['clients'])} clients, {report['keys']} keys, "
        f"{report['requests_per_minute']:g} requests a minute",
        file=out,
    )
    print("  time   RSS        fds files  kvcache+WAL   responses+WAL  requests  failed", file=out)
    for s in report["samples"]:
        d = s["disk_bytes"]
        print(
            f"  {int(s['t_s']) // 60:3d}:{int(s['t_s']) % 60:02d} {_mb(s['rss_bytes']):>10} "
            f"{s['open_fds']:4d} {s['open_files']:5d}  "
            f"{_mb(d['kvcache.db'] + d['kvcache.db-wal']):>11}   "
            f"{_mb(d['responses.db'] + d['responses.db-wal']):>12}  {s['requests']:8d}  "
            f"{s['failed']:6d}",
            file=out,
        )
    restart = report["restart"]
    if restart:
        print(
            f"  restart: stopped in {restart['stop_s']:.1f} s (exit {restart['exit_status']}), "
            f"serving again {restart['down_s']:.1f} s after the stop began",
            file=out,
        )
    for dialect, outcomes in req["by_dialect"].items():
        median = req["median_reply_s"].get(dialect)
        print(
            f"  {dialect:9} "
            + ", ".join(f"{k} {v}" for k, v in outcomes.items())
            + (f"; median reply {median:.2f} s" if median is not None else ""),
            file=out,
        )
    print(f"  errors: {req['errors'] or 'none'}", file=out)
    print(f"  while restarting (sent again): {req['restart_errors'] or 'none'}", file=out)
    print(
        f"  replies compared with --no-cache: {req['replies_compared']}, mismatches "
        f"{req['mismatches']}; not compared: {req['not_compared'] or 'none'}",
        file=out,
    )
    for example in req["mismatch_examples"]:
        print(f"    {example}", file=out)
    for name, store in report["stores"].items():
        budget = store["budget_bytes"]
        if isinstance(budget, list):  # the KV cache's, at each load
            budget = " then ".join(_mb(b) for b in budget)
        elif budget is not None:
            budget = _mb(budget)
        counted = store.get("counted_max_bytes")
        print(
            f"  {name:11} on disk at most {_mb(store['disk_max_bytes'])}"
            + (f", counted at most {_mb(counted)}" if counted is not None else "")
            + (f", budget {budget}" if budget is not None else ", no budget of its own")
            + ("" if store["within"] else "  (PAST ITS BUDGET)"),
            file=out,
        )
        if "per_key_counted_max_bytes" in store:
            print(
                "              each key's at most ("
                + ", ".join(f"{k} {_mb(v)}" for k, v in store["per_key_counted_max_bytes"].items())
                + f"), each key's budget {_mb(store['per_key_budget_bytes'])}",
                file=out,
            )
    rss = report["rss"]
    for process in rss.get("processes", []):
        if process["drift"] is not None:
            print(
                f"  RSS, server {process['process']} (from {process['started_s'] / 60:.1f} min): "
                f"median {_mb(process['reference_bytes'])} after "
                f"{process['warmup_s'] / 60:.1f} min, {_mb(process['end_bytes'])} at its end "
                f"({process['drift']:+.1%})",
                file=out,
            )
    if rss["drift"] is not None:
        print(
            f"  RSS, the whole run (across the restart): median {_mb(rss['reference_bytes'])} "
            f"at {rss['warmup_s'] / 60:.1f} min, {_mb(rss['end_bytes'])} at the end "
            f"({rss['drift']:+.1%})",
            file=out,
        )
    log = report["server_log"]
    print(f"  server log: {log['lines']} lines, {log['notable']} warnings or errors", file=out)
    for line in log["notable_last"]:
        print(f"    {line[:160]}", file=out)
    names = {
        "rss_flat": "RSS flat within 5 % after the warm-up, in each server process",
        "stores_within_budget": "every store within its budget",
        "no_5xx": "no 5xx (nor an error event in a stream) outside the restart",
        "no_mismatches": "no reply differs from --no-cache's",
    }
    for key, met in report["targets"].items():
        print(f"  {'pass' if met else 'FAIL'}  {names[key]}", file=out)
