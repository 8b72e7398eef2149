"""``radixchat bench kv-capacity``: what quantized KV (``--kv-bits 8|4``) buys and costs,
each against full precision in the same run, on the same weights.

Each repetition runs every KV format (full precision, 8-bit, 4-bit; groups of
``--group-size``), in turn (the order rotates between repetitions), in a fresh data folder
under ``<data>/tmp``, with the pool's RAM budget ``--budget-mb``:

- **tokens the pool holds** in that budget (the engine's pool: pages x page size);
- engine A builds a session of about ``--tokens`` tokens (a system prompt of travel notes
  and a greedy reply), waits until it is on disk, and **decodes** ``--decode-tokens``
  greedy tokens after a follow-up (the engine's decode tokens/s, the CPU speed-ups as in
  serving); the session's **bytes on disk per token** (its pages, as stored);
- engine B starts on the folder (the restart), warms up, the database leaves the page
  cache, then asks the follow-up in the session: **restore** is its TTFT (the history read
  back from disk, the follow-up computed), with how many tokens it restored.

For comparison, **mlx-lm's own decode** in each repetition: its ``generate_step`` on the
same weights (loaded once in this process), a prompt of the session's length, with its
``kv_bits`` for a quantized format (``bench kv-quality``'s ``mlx_lm_steps``): its tok/s
over ``--decode-tokens`` and its own ratio against its full precision, which tells MLX's
quantized attention kernels (theirs) from our engine's code.

Medians over repetitions; ratios against full precision are ratios of medians. Targets
(issue 33): 8-bit holds >= 1.9x the tokens, writes <= 0.55x the bytes per token, decodes at
>= 0.9x; 4-bit holds >= 3.5x. On the CPU, MLX's quantized kernels are slow: decode is
measured, not assumed.
"""

from __future__ import annotations

import gc
import json
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
from bench.restore import checked_model
from core import paths
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ChatMessage, DoneEvent
from core.errors import UserError

SESSION = "bench-kv-capacity"
FIRST_QUESTION = "Summarize these travel notes in one sentence."
FOLLOW_UP = "Which of these notes matters most for a first visit, and why?"
BUILD_REPLY_TOKENS = 32
RESTORE_REPLY_TOKENS = 4  # the restored turn: TTFT is the figure
FORMATS = (("full", None), ("8-bit", 8), ("4-bit", 4))
TARGETS = {  # (figure, format): (bound, "min" or "max")
    ("pool_tokens", "8-bit"): (1.9, "min"),
    ("disk_bytes_per_token", "8-bit"): (0.55, "max"),
    ("decode_tokens_per_s", "8-bit"): (0.9, "min"),
    ("pool_tokens", "4-bit"): (3.5, "min"),
}


@dataclass(frozen=True)
class Run:
    """One format's figures in one repetition."""

    pool_tokens: int
    history_tokens: int
    disk_bytes_per_token: float
    decode_tokens_per_s: float
    decoded_tokens: int
    restore_ttft_s: float
    restored_tokens: int
    mlx_lm_decode_tokens_per_s: float
    kv_format: str  # per layer kind, as the engine reports it


def _ask(engine: Engine, messages, *, session=None, use_cache=True, max_tokens) -> DoneEvent:
    return ask_greedy(
        engine, messages, "kv-capacity", session=session, use_cache=use_cache, max_tokens=max_tokens
    )


def _history(engine: Engine, tokens: int) -> tuple[list[ChatMessage], int]:
    """A session turn whose prompt + reply reach about ``tokens``: its messages, its length."""

    def prompt_tokens(notes: int) -> int:
        messages = [ChatMessage("system", travel_notes(notes)), ChatMessage("user", FIRST_QUESTION)]
        return _ask(engine, messages, use_cache=False, max_tokens=1).stats.prompt_tokens

    base, cycle = prompt_tokens(0), prompt_tokens(len(TRAVEL_NOTES))  # also the warm-up
    per_note = max(1.0, (cycle - base) / len(TRAVEL_NOTES))
    count = max(1, round((tokens - BUILD_REPLY_TOKENS - base) / per_note))
    history = [ChatMessage("system", travel_notes(count)), ChatMessage("user", FIRST_QUESTION)]
    reply = _ask(engine, history, session=SESSION, max_tokens=BUILD_REPLY_TOKENS)
    stats = reply.stats
    return history + [ChatMessage("assistant", reply.text)], stats.prompt_tokens + (
        stats.completion_tokens
    )


def _mlx_lm_decode(model, prompt: list[int], bits: int | None, args) -> float:
    """mlx-lm's greedy decode tok/s after ``prompt``, its K/V at ``bits`` (None: full)."""
    from bench.kv_quality import mlx_lm_steps

    steps = mlx_lm_steps(model, prompt, args.decode_tokens + 1, bits, args.group_size)
    next(steps)  # the first token: the prompt has been computed
    first = time.perf_counter()
    decoded = sum(1 for _ in steps)
    return decoded / (time.perf_counter() - first)


def _run(folder: Path, spec: str, bits: int | None, args, mlx_lm) -> Run:
    import mlx.core as mx

    from kvcache.store import DiskStore

    config = EngineConfig(
        pool_bytes=args.budget_mb << 20, kv_bits=bits, kv_group_size=args.group_size
    )

    def engine() -> Engine:
        started = Engine(folder, spec, config=config).start()
        info = started.wait_ready()
        if args.tokens + 128 + args.decode_tokens >= info.context_length:
            started.shutdown()
            raise UserError(
                f"--tokens {args.tokens} does not fit {info.name}'s context of "
                f"{info.context_length}"
            )
        return started

    def close(done: Engine) -> None:
        done.shutdown()
        gc.collect()
        mx.clear_cache()

    first = engine()
    try:
        cache = first.stats().cache
        if cache is None or not cache.enabled:
            raise UserError("bench kv-capacity: the model runs without a KV cache")
        pool_tokens = cache.pages_total * cache.page_size
        history, history_tokens = _history(first, args.tokens)
        first.flush_disk_cache()
        follow_up = history + [ChatMessage("user", FOLLOW_UP)]
        decoded = _ask(first, follow_up, max_tokens=args.decode_tokens)  # no session
        kv_format = first.stats().cache.kv_format
    finally:
        close(first)
    with DiskStore(paths.kv_cache_db_path(folder)) as store:
        stored = store.session(SESSION)
    if stored is None or not stored.tokens:
        raise UserError("bench kv-capacity: the session was not found on disk after the save")
    second = engine()  # "after a restart"
    try:
        _ask(second, [ChatMessage("user", "Hello")], use_cache=False, max_tokens=1)  # warm-up
        drop_from_page_cache(*paths.kv_cache_db_files(folder))
        restored = _ask(second, follow_up, session=SESSION, max_tokens=RESTORE_REPLY_TOKENS)
    finally:
        close(second)
    return Run(
        pool_tokens=pool_tokens,
        history_tokens=history_tokens,
        disk_bytes_per_token=stored.nbytes / stored.tokens,
        decode_tokens_per_s=decoded.stats.decode_tps,
        decoded_tokens=decoded.stats.completion_tokens,
        restore_ttft_s=restored.stats.ttft_s,
        restored_tokens=restored.stats.restored_tokens,
        mlx_lm_decode_tokens_per_s=_mlx_lm_decode(*mlx_lm, bits, args),
        kv_format=kv_format,
    )


def run_bench_kv_capacity(args) -> int:
    root, spec = checked_model(args)
    from core.models.load.loader import load_model

    runs: dict[str, list[Run]] = {label: [] for label, _ in FORMATS}
    started = time.perf_counter()
    loaded = load_model(spec, root)  # mlx-lm's own decode, on the same weights
    count = len(TRAVEL_NOTES)
    while len(loaded.tokenizer.encode(travel_notes(count))) < args.tokens:
        count *= 2
    prompt = loaded.tokenizer.encode(travel_notes(count))[: args.tokens]
    mlx_lm = (loaded.model, prompt)
    for rep in repetitions("kv-capacity", args.repeats):
        order = FORMATS[rep % len(FORMATS) :] + FORMATS[: rep % len(FORMATS)]
        for label, bits in order:
            with scratch_data_folder(root, "kv-capacity") as folder:
                runs[label].append(_run(folder, spec, bits, args, mlx_lm))
    report = _report(args, spec, runs, time.perf_counter() - started)
    print(json.dumps(report, indent=2) if args.json else format_summary(report))
    return 0


def _report(args, spec: str, runs: dict[str, list[Run]], wall_s: float) -> dict:
    figures = (
        "pool_tokens",
        "disk_bytes_per_token",
        "decode_tokens_per_s",
        "restore_ttft_s",
        "mlx_lm_decode_tokens_per_s",
    )
    medians = {
        label: {f: statistics.median(getattr(r, f) for r in reps) for f in figures}
        | {
            "restored_tokens": statistics.median(r.restored_tokens for r in reps),
            "history_tokens": statistics.median(r.history_tokens for r in reps),
            "kv_format": reps[0].kv_format,
        }
        for label, reps in runs.items()
    }
    full = medians["full"]
    ratios = {
        label: {f: m[f] / full[f] if full[f] else None for f in figures}
        for label, m in medians.items()
        if label != "full"
    }
    targets = {}
    for (figure, label), (bound, kind) in TARGETS.items():
        ratio = ratios[label][figure]
        met = ratio is not None and (ratio >= bound if kind == "min" else ratio <= bound)
        targets[f"{label} {figure}"] = {"ratio": ratio, "bound": bound, "kind": kind, "met": met}
    return {
        "model": args.model,
        "model_path": spec,
        "tokens": args.tokens,
        "budget_mb": args.budget_mb,
        "decode_tokens": args.decode_tokens,
        "group_size": args.group_size,
        "repeats": args.repeats,
        "wall_s": round(wall_s, 1),
        "medians": medians,
        "ratios_vs_full": ratios,
        "targets": targets,
        "repetitions": {label: [asdict(r) for r in reps] for label, reps in runs.items()},
    }


def format_summary(report: dict) -> str:
    lines = [
        f"model: {report['model']} ({report['model_path']}); pool budget "
        f"{report['budget_mb']} MB, session ~{report['tokens']} tokens, "
        f"{report['decode_tokens']} decoded; medians of {report['repeats']} "
        f"({report['wall_s']:.0f} s)"
    ]
    for label, m in report["medians"].items():
        ratio = report["ratios_vs_full"].get(label)

        def x(figure: str, ratio=ratio) -> str:
            return f" ({ratio[figure]:.2f}x)" if ratio else ""

        lines.append(
            f"  {label:6} pool {m['pool_tokens']:,.0f} tokens{x('pool_tokens')}; disk "
            f"{m['disk_bytes_per_token']:,.0f} B/token{x('disk_bytes_per_token')}; decode "
            f"{m['decode_tokens_per_s']:.1f} tok/s{x('decode_tokens_per_s')} (mlx-lm's own "
            f"{m['mlx_lm_decode_tokens_per_s']:.1f} tok/s{x('mlx_lm_decode_tokens_per_s')}); "
            f"restore TTFT "
            f"{m['restore_ttft_s']:.3f} s{x('restore_ttft_s')} ({m['restored_tokens']:.0f} "
            f"tokens restored)"
        )
        lines.append(f"         KV format: {m['kv_format']}")
    for name, t in report["targets"].items():
        sign = ">=" if t["kind"] == "min" else "<="
        lines.append(
            f"  target {name} {sign} {t['bound']}x: {t['ratio']:.2f}x "
            f"{'met' if t['met'] else 'MISSED'}"
        )
    return "\n".join(lines)
