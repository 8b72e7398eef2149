"""``radixchat bench restore``: the next turn of an N-token chat after a restart.

Each repetition, in a fresh data folder under ``<data>/tmp`` (the model given by path):
engine A builds the session (a system prompt of travel notes, sized by two short
calibration requests so that prompt + greedy reply reach about N tokens) and waits until
it is on disk; then **ram**: A, never restarted, answers the follow-up (no session, so
the store keeps the N-token session). A shuts down, every RAM cache with it. The
session's read is timed as a restore reads it (``DiskStore.read_session``: every page
streamed, checksummed and dropped once used) against a plain sequential read of as many
bytes in the same folder, cold (after ``fsync`` + ``POSIX_FADV_DONTNEED``) and
warm (again right away), three times each, the two taking turns to go first. Engine B starts on
that folder (the restart), warms up on an unrelated request, the database leaves the page cache
again, then **restore**: the follow-up in the session (its history comes back from disk), and
**recompute**: the same request with ``use_cache=False``. TTFT is the engine's own (request
start to first token, restore included); the three greedy replies must agree (reported, never
hidden). Medians over repetitions; ratios are ratios of medians.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.harness import (
    TRAVEL_NOTES,
    ask_greedy,
    drop_from_page_cache,
    repetitions,
    scratch_data_folder,
    travel_notes,
)
from core import paths
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ChatMessage, DoneEvent
from core.errors import UserError

SESSION = "bench-restore"
FIRST_QUESTION = "Summarize these travel notes in one sentence."
FOLLOW_UP = "Which of these notes matters most for a first visit, and why?"
BUILD_REPLY_TOKENS = 32
REPLY_TOKENS = 8  # per measured turn: TTFT is the figure, not decode
READ_ROUNDS = 3  # timings of each read (store, plain), in turns


@dataclass(frozen=True)
class Repetition:
    history_tokens: int  # the built session: first prompt + reply
    prompt_tokens: int  # the measured follow-up's prompt
    restored_tokens: int
    ttft_restore_s: float
    ttft_recompute_s: float
    ttft_ram_s: float
    replies_identical: bool
    session_bytes: int  # tokens + K/V (+ snapshots) of the session's pages, as read
    # DiskStore.read_session, all pages; cold: None where it cannot be had
    load_cold_s: float | None
    load_warm_s: float
    plain_cold_s: float | None  # a sequential read of a file of session_bytes
    plain_warm_s: float


def _ask(
    engine: Engine, messages, *, session=None, use_cache=True, max_tokens=REPLY_TOKENS
) -> DoneEvent:
    return ask_greedy(
        engine, messages, "restore", session=session, use_cache=use_cache, max_tokens=max_tokens
    )


def _build_session(engine: Engine, tokens: int) -> tuple[list[ChatMessage], int]:
    """Chat one turn whose prompt + reply reach about ``tokens``; returns the history and
    its length in tokens."""

    def prompt_tokens(notes: int) -> int:
        messages = [ChatMessage("system", travel_notes(notes)), ChatMessage("user", FIRST_QUESTION)]
        return _ask(engine, messages, use_cache=False, max_tokens=1).stats.prompt_tokens

    base, cycle = prompt_tokens(0), prompt_tokens(len(TRAVEL_NOTES))  # also the engine's warm-up
    per_note = max(1.0, (cycle - base) / len(TRAVEL_NOTES))
    count = max(1, round((tokens - BUILD_REPLY_TOKENS - base) / per_note))
    history = [ChatMessage("system", travel_notes(count)), ChatMessage("user", FIRST_QUESTION)]
    reply = _ask(engine, history, session=SESSION, max_tokens=BUILD_REPLY_TOKENS)
    return history + [
        ChatMessage("assistant", reply.text)
    ], reply.stats.prompt_tokens + reply.stats.completion_tokens


def _seconds(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _read_plain(path: Path) -> None:
    buffer = bytearray(1 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass


def _read_rates(folder: Path, fingerprint: str) -> dict:
    """The session's bytes, and the seconds a restore's read of them and a plain
    sequential read of as many bytes take, cold (None if it cannot be had) and warm.

    Each is timed ``READ_ROUNDS`` times, the two taking turns to go first, so whatever
    else the machine is doing at the time (right after an engine shut down, the kernel
    is still handing its memory back) falls on both alike; medians are kept."""
    from kvcache.store import DiskStore

    sizes: list[int] = []

    def read_store(store: DiskStore) -> None:  # as a restore reads: streamed, verified, dropped
        sizes.clear()
        with store.read_session(SESSION, fingerprint) as reader:
            sizes.extend(
                4 * len(p.tokens) + len(p.kv) + len(p.snapshot or b"") for p in reader.pages()
            )

    plain = folder / "plain-read.bin"
    times: dict[str, list[float]] = {
        name: [] for name in ("load_cold", "load_warm", "plain_cold", "plain_warm")
    }
    with DiskStore(paths.kv_cache_db_path(folder)) as store:
        info = store.session(SESSION)
        if info is None:
            raise UserError("bench restore: the session was not found on disk after the save")
        with open(plain, "wb") as f:
            for start in range(0, info.nbytes, 1 << 24):
                f.write(os.urandom(min(1 << 24, info.nbytes - start)))
        try:
            reads = (
                ("load", lambda: read_store(store), list(paths.kv_cache_db_files(folder))),
                ("plain", lambda: _read_plain(plain), [plain]),
            )
            for turn in range(READ_ROUNDS):
                for name, action, files in reads[::-1] if turn % 2 else reads:
                    cold = drop_from_page_cache(*files)
                    times[f"{name}_cold"].append(_seconds(action))
                    times[f"{name}_warm"].append(_seconds(action))
        finally:
            plain.unlink()
    if sum(sizes) != info.nbytes:
        raise UserError(f"bench restore: read {sum(sizes)} bytes of a {info.nbytes}-byte session")
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "session_bytes": info.nbytes,
        "load_cold_s": median["load_cold"] if cold else None,
        "load_warm_s": median["load_warm"],
        "plain_cold_s": median["plain_cold"] if cold else None,
        "plain_warm_s": median["plain_warm"],
    }


def _repetition(folder: Path, spec: str, tokens: int) -> Repetition:
    import mlx.core as mx

    pool = 1024 * -(-(tokens + 1024) // 1024)

    def engine() -> Engine:
        started = Engine(folder, spec, config=EngineConfig(pool_tokens=pool)).start()
        info = started.wait_ready()
        if tokens + 128 + REPLY_TOKENS >= info.context_length:
            started.shutdown()
            raise UserError(
                f"--tokens {tokens} does not fit {info.name}'s context of {info.context_length}"
            )
        return started

    def close(done: Engine) -> None:
        done.shutdown()
        gc.collect()  # free its weights and pool before the next one loads
        mx.clear_cache()

    first = engine()
    try:
        history, history_tokens = _build_session(first, tokens)
        first.flush_disk_cache()
        follow_up = history + [ChatMessage("user", FOLLOW_UP)]
        ram = _ask(first, follow_up)  # no session: the store keeps the N-token session
        fingerprint = first.model_info.fingerprint
    finally:
        close(first)
    rates = _read_rates(folder, fingerprint)
    second = engine()  # "after a restart"
    try:
        _ask(second, [ChatMessage("user", "Hello")], use_cache=False, max_tokens=1)  # warm-up
        drop_from_page_cache(*paths.kv_cache_db_files(folder))
        restored = _ask(second, follow_up, session=SESSION)
        recompute = _ask(second, follow_up, use_cache=False)
    finally:
        close(second)
    return Repetition(
        history_tokens=history_tokens,
        prompt_tokens=restored.stats.prompt_tokens,
        restored_tokens=restored.stats.restored_tokens,
        ttft_restore_s=restored.stats.ttft_s,
        ttft_recompute_s=recompute.stats.ttft_s,
        ttft_ram_s=ram.stats.ttft_s,
        replies_identical=restored.text == recompute.text == ram.text,
        **rates,
    )


def checked_model(args) -> tuple[Path, str]:
    """The data folder and the resolved model spec, once ``--tokens`` and ``--repeats``
    are known to be usable (both restore benches start here)."""
    for name, low in (("tokens", 64), ("repeats", 1)):
        if getattr(args, name) < low:
            raise UserError(f"--{name} must be at least {low}")
    from core.cli.progress import print_progress
    from core.models.load.loader import resolve_spec

    root = paths.data_dir(args.data_dir)
    return root, str(
        resolve_spec(args.model, root, None if args.json else print_progress).resolve()
    )


def run_bench_restore(args) -> int:
    root, spec = checked_model(args)
    reps: list[Repetition] = []
    started = time.perf_counter()
    for _ in repetitions("restore", args.repeats):
        with scratch_data_folder(root, "restore") as folder:
            reps.append(_repetition(folder, spec, args.tokens))
    report = _report(args, spec, reps, time.perf_counter() - started)
    print(json.dumps(report, indent=2) if args.json else format_summary(report))
    return 0


def _report(args, spec: str, reps: list[Repetition], wall_s: float) -> dict:
    def median(field: str) -> float | None:
        values = [getattr(r, field) for r in reps]
        return None if None in values else statistics.median(values)

    nbytes = median("session_bytes")
    rate = {
        name: (nbytes / median(field) if median(field) else None)
        for name, field in (
            ("restore_cold", "load_cold_s"),
            ("restore_warm", "load_warm_s"),
            ("plain_cold", "plain_cold_s"),
            ("plain_warm", "plain_warm_s"),
        )
    }
    cold = rate["restore_cold"] is not None and rate["plain_cold"] is not None
    ttft = {way: median(f"ttft_{way}_s") for way in ("restore", "recompute", "ram")}
    return {
        "model": args.model,
        "model_path": spec,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "wall_s": round(wall_s, 1),
        "history_tokens": median("history_tokens"),
        "prompt_tokens": median("prompt_tokens"),
        "restored_tokens": median("restored_tokens"),
        "replies_identical": all(r.replies_identical for r in reps),
        "ttft_s": ttft,
        "session_bytes": nbytes,
        "read_bytes_per_s": rate,
        "read_basis": "cold: after fsync + POSIX_FADV_DONTNEED"
        if cold
        else "warm only: this platform cannot drop a file from the page cache",
        "repetitions": [asdict(r) for r in reps],
        "restore_read_fraction_of_disk_warm": rate["restore_warm"] / rate["plain_warm"],
        "ttft_ratio_restore_vs_recompute": ttft["restore"] / ttft["recompute"],
        "ttft_ratio_restore_vs_ram": ttft["restore"] / ttft["ram"],
        "restore_read_fraction_of_disk": (
            rate["restore_cold"] / rate["plain_cold"]
            if cold
            else rate["restore_warm"] / rate["plain_warm"]
        ),
    }


def format_summary(report: dict) -> str:
    t, r = report["ttft_s"], report["read_bytes_per_s"]

    def mbs(value: float | None) -> str:
        return "     n/a" if value is None else f"{value / 1e6:8.1f} MB/s"

    return "\n".join(
        [
            (
                f"model: {report['model']} ({report['model_path']}); medians of "
                f"{report['repeats']} repetitions ({report['wall_s']:.0f} s)"
            ),
            (
                f"history {report['history_tokens']:.0f} tokens; follow-up prompt "
                f"{report['prompt_tokens']:.0f} tokens, {report['restored_tokens']:.0f} of them "
                "restored from disk"
            ),
            (
                f"TTFT: restored {t['restore']:.3f} s, recomputed {t['recompute']:.3f} s, RAM "
                f"cache {t['ram']:.3f} s"
            ),
            (
                f"restore / recompute {report['ttft_ratio_restore_vs_recompute']:.3f} (target <= "
                f"0.05), restore / RAM {report['ttft_ratio_restore_vs_ram']:.3f} (target <= 1.5)"
            ),
            "replies: identical in all three ways"
            if report["replies_identical"]
            else "replies: DIFFER",
            f"session read ({report['session_bytes'] / 1e6:.1f} MB), {report['read_basis']}:",
            (
                f"  DiskStore.read_session  cold {mbs(r['restore_cold'])}  warm "
                f"{mbs(r['restore_warm'])}"
            ),
            f"  plain sequential read   cold {mbs(r['plain_cold'])}  warm {mbs(r['plain_warm'])}",
            (
                f"restore read / plain read {report['restore_read_fraction_of_disk']:.3f} "
                f"(target >= 0.5); warm {report['restore_read_fraction_of_disk_warm']:.3f}"
            ),
        ]
    )
