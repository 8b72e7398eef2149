"""``radixchat bench pressure``: RAM too small for the working set, with and without the disk.

``--clients`` clients (16) each own a long system prompt of about ``--tokens`` tokens (its
own travel notes) and cycle through it: in every one of ``--rounds`` rounds, each client
in turn sends its prompt plus a new short question (greedy, ``REPLY_TOKENS`` tokens), as
an agent re-sends its context. The KV pool holds a quarter of the working set (the
clients' prompts), so RAM alone keeps about four clients' prefixes. Two ways, each on a
fresh engine in a fresh data folder, taking turns over ``--repeats`` repetitions:

- **disk**: the disk tier on (prefixes written at a request's end and written back on
  eviction; read back by their tokens when RAM lost them);
- **ram**: the disk cache off: an evicted prefix is recomputed.

The figure is the sum of the engine's TTFT over the rounds after the first (the first
round computes everything either way), disk over ram (target <= 0.5). Bytes written by
the disk tier are set against the K/V bytes of the distinct tokens stored: the token
positions of every stored chain counted once (a trie over the store's chains), times
the model's K/V bytes per token (target <= 1.1x). The greedy replies of both ways must
agree (reported, never hidden). Medians over repetitions.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.harness import (
    announce_repetition,
    final_event,
    scratch_data_folder,
    travel_notes,
)
from core import paths
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ChatMessage, DoneEvent, GenerationRequest, SamplingParams
from core.errors import UserError

REPLY_TOKENS = 8
QUESTIONS = (
    "What should I see first?",
    "Where should I eat tonight?",
    "How do I get around?",
    "What is worth skipping?",
    "Which day is best for the market?",
    "What should I pack?",
)


@dataclass(frozen=True)
class WayResult:
    way: str
    ttft_sum_s: float  # rounds after the first
    ttft_first_round_s: float
    restored_tokens: int
    cached_tokens: int
    computed_tokens: int
    bytes_written: int
    distinct_kv_bytes: int
    replies: tuple[str, ...]


def _ask(engine: Engine, messages: list[ChatMessage]) -> DoneEvent:
    request = GenerationRequest(
        messages=tuple(messages), sampling=SamplingParams(temperature=0.0, max_tokens=REPLY_TOKENS)
    )
    return final_event(engine.stream(request), "pressure")


def _system(client: int, notes: int) -> ChatMessage:
    return ChatMessage(
        "system", f"Client {client}. These are my travel notes.\n{travel_notes(notes)}"
    )


def _distinct_tokens(db: Path, fingerprint: str) -> int:
    """Token positions of the store's chains for ``fingerprint``, each counted once."""
    from kvcache.store import DiskStore
    from kvcache.store_format import unpack_tokens

    with DiskStore(db) as store:
        pages = {page.key: page for page in store.index(fingerprint)}
    trie: dict = {}
    count = 0
    for key in pages:
        path, at = [], key
        while at is not None and at in pages:
            path.append(pages[at])
            at = pages[at].parent
        node = trie
        for page in reversed(path):
            for token in unpack_tokens(page.tokens):
                if token not in node:
                    node[token] = {}
                    count += 1
                node = node[token]
    return count


def _way(way: str, folder: Path, spec: str, args, notes: int, pool: int) -> WayResult:
    import mlx.core as mx

    engine = Engine(
        folder, spec, config=EngineConfig(pool_tokens=pool, disk_cache=way == "disk")
    ).start()
    try:
        engine.wait_ready()
        _ask(engine, [ChatMessage("user", "Hello")])  # warm-up
        first = later = 0.0
        restored = cached = computed = 0
        replies = []
        for round_ in range(args.rounds):
            for client in range(args.clients):
                question = f"Round {round_}: {QUESTIONS[(client + round_) % len(QUESTIONS)]}"
                done = _ask(engine, [_system(client, notes), ChatMessage("user", question)])
                replies.append(done.text)
                if round_ == 0:
                    first += done.stats.ttft_s
                else:
                    later += done.stats.ttft_s
                    restored += done.stats.restored_tokens
                    cached += done.stats.cached_tokens
                    computed += done.stats.computed_tokens
        engine.flush_disk_cache()
        stats = engine.stats()
        written = stats.disk.bytes_written if stats.disk is not None else 0
        cache = stats.cache
        token_bytes = cache.pool_budget_bytes // ((cache.pages_total + 1) * cache.page_size)
        fingerprint = engine.model_info.fingerprint
    finally:
        engine.shutdown()
        gc.collect()
        mx.clear_cache()
    distinct = (
        _distinct_tokens(paths.kv_cache_db_path(folder), fingerprint) * token_bytes
        if way == "disk"
        else 0
    )
    return WayResult(
        way, later, first, restored, cached, computed, written, distinct, tuple(replies)
    )


def run_bench_pressure(args) -> int:
    import json

    for name, low in (("tokens", 64), ("repeats", 1), ("clients", 2), ("rounds", 2)):
        if getattr(args, name) < low:
            raise UserError(f"--{name} must be at least {low}")
    from core.cli.progress import print_progress
    from core.models.load.loader import resolve_spec

    root = paths.data_dir(args.data_dir)
    spec = str(resolve_spec(args.model, root, None if args.json else print_progress).resolve())
    started = time.perf_counter()
    # size the notes: a calibration engine, no cache
    with scratch_data_folder(root, "pressure") as folder:
        engine = Engine(
            folder, spec, config=EngineConfig(use_cache=False, disk_cache=False)
        ).start()
        try:
            engine.wait_ready()
            base = _ask(
                engine, [_system(0, 0), ChatMessage("user", QUESTIONS[0])]
            ).stats.prompt_tokens
            two = _ask(
                engine, [_system(0, 2), ChatMessage("user", QUESTIONS[0])]
            ).stats.prompt_tokens
        finally:
            engine.shutdown()
    per_note = max(1.0, (two - base) / 2)
    notes = max(1, round((args.tokens - base) / per_note))
    prompt = base + notes * per_note
    pool = int(args.clients * (prompt + REPLY_TOKENS) / 4)  # a quarter of the working set
    results: dict[str, list[WayResult]] = {"disk": [], "ram": []}
    for rep in range(args.repeats):
        for way in ("disk", "ram") if rep % 2 == 0 else ("ram", "disk"):
            announce_repetition("pressure", rep, args.repeats, way)
            with scratch_data_folder(root, "pressure") as folder:
                results[way].append(_way(way, folder, spec, args, notes, pool))
    report = _report(args, spec, prompt, pool, results, time.perf_counter() - started)
    print(json.dumps(report, indent=2) if args.json else format_summary(report))
    return 0


def _report(args, spec: str, prompt: float, pool: int, results: dict, wall_s: float) -> dict:
    def median(way: str, field: str) -> float:
        return statistics.median(getattr(r, field) for r in results[way])

    written, distinct = median("disk", "bytes_written"), median("disk", "distinct_kv_bytes")
    reference = results["ram"][0].replies
    return {
        "model": args.model,
        "model_path": spec,
        "clients": args.clients,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "prompt_tokens": round(prompt),
        "pool_tokens": pool,
        "wall_s": round(wall_s, 1),
        "ttft_sum_s": {way: median(way, "ttft_sum_s") for way in ("disk", "ram")},
        "ttft_first_round_s": {way: median(way, "ttft_first_round_s") for way in ("disk", "ram")},
        "ttft_ratio_disk_vs_ram": median("disk", "ttft_sum_s") / median("ram", "ttft_sum_s"),
        "tokens_after_first_round": {
            way: {
                name: median(way, f"{name}_tokens") for name in ("restored", "cached", "computed")
            }
            for way in ("disk", "ram")
        },
        "bytes_written": written,
        "distinct_kv_bytes": distinct,
        "written_vs_distinct": written / distinct if distinct else None,
        "replies_identical": all(r.replies == reference for way in results for r in results[way]),
        "repetitions": {
            way: [{k: v for k, v in asdict(r).items() if k != "replies"} for r in results[way]]
            for way in results
        },
    }


def format_summary(report: dict) -> str:
    t, f, tok = (
        report["ttft_sum_s"],
        report["ttft_first_round_s"],
        report["tokens_after_first_round"],
    )
    ratio = report["written_vs_distinct"]
    return "\n".join(
        [
            (
                f"model: {report['model']} ({report['model_path']}); {report['clients']} clients "
                f"x {report['rounds']} rounds, prompts of ~{report['prompt_tokens']} tokens, "
                f"pool {report['pool_tokens']} tokens; medians of {report['repeats']} "
                f"({report['wall_s']:.0f} s)"
            ),
            (
                f"TTFT sum after round 1: disk tier {t['disk']:.2f} s, RAM only {t['ram']:.2f} s "
                f"-> {report['ttft_ratio_disk_vs_ram']:.3f} (target <= 0.5); round 1: "
                f"{f['disk']:.2f} s / {f['ram']:.2f} s"
            ),
            f"prompt tokens after round 1, disk tier: {tok['disk']['restored']:.0f} from disk, "
            f"{tok['disk']['cached']:.0f} RAM, {tok['disk']['computed']:.0f} computed; RAM only: "
            f"{tok['ram']['cached']:.0f} RAM, {tok['ram']['computed']:.0f} computed",
            (
                f"written {report['bytes_written'] / 1e6:.1f} MB for "
                f"{report['distinct_kv_bytes'] / 1e6:.1f} MB of distinct K/V -> {ratio:.3f}x "
                "(target <= 1.1)"
            )
            if ratio is not None
            else "nothing written",
            "replies: identical both ways" if report["replies_identical"] else "replies: DIFFER",
        ]
    )
