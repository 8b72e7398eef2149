"""``radixchat bench key-fairness``: does one API key's long prompt hold another key's chat?

On the engine directly (no HTTP), greedy, the prompt cache off so every prompt is computed.
Key B sends a 4-token chat (a reply of ``REPLY_TOKENS`` tokens); key A sends long prompts
(one token of reply each). Two engines on the same weights, one with the prefill shared
between keys (``core.engine.turns``: each chunk to the key served least recently, chunks
sized to a budget while nobody decodes) and one with the order before it (priority, then
arrival, whole chunks), so both are measured in the same run; they take turns, scenario by
scenario, in an order that swaps each repetition. Each repetition, on each engine:

1. B alone: its time to first token (submit to its first token, as its reading thread
   sees it);
2. behind one long prompt: A sends a ``--long-tokens`` prompt; once its first chunk is in,
   B sends its chat. B's time to first token, and A's total time (submit to its answer);
3. behind a queue: A sends ``--queue`` prompts of ``--queue-tokens`` at once; once the
   first has a chunk in, B sends its chat. B's time to first token, and A's total time
   (submit to the last answer).

Reported, medians over repetitions: B's TTFT in each case and over its TTFT alone, A's total
time shared over before. Targets (issue 42.2): B's TTFT at most 2 s and at most 3x alone
behind any long prompt or queue of them; A's total time at most 1.15x before.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import threading
import time
from dataclasses import replace

from bench.fairness import long_request
from bench.harness import announce_repetition, package_version
from core import paths
from core.engine.config import EngineConfig
from core.engine.engine import Engine, RequestHandle
from core.engine.namespaces import for_key
from core.engine.turns import PrefillSharing
from core.engine.types import (
    ChatMessage,
    DoneEvent,
    ErrorEvent,
    GenerationRequest,
    ProgressEvent,
    SamplingParams,
)
from core.errors import UserError

POOL_TOKENS = 32768
REPLY_TOKENS = 4  # key B's reply
KEY_A, KEY_B = for_key("bench key A"), for_key("bench key B")
POLICIES = ("shared", "before")  # prefill shared between keys; the order before it
TARGET_TTFT_S = 2.0
TARGET_TTFT_VS_ALONE = 3.0
TARGET_LONG_TOTAL = 1.15


class _Reader:
    """One request's events on a thread of its own: when its first chunk was in, its first
    token came and it ended (``time.perf_counter()``)."""

    def __init__(self, handle: RequestHandle):
        self.handle = handle
        self.sent = time.perf_counter()
        self.chunk_in = threading.Event()
        self.first_token_at: float | None = None
        self.ended_at: float | None = None
        self.error: str | None = None
        self.thread = threading.Thread(target=self._read, name="bench-key-fairness", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for event in self.handle.events(timeout=3600):
            now = time.perf_counter()
            if isinstance(event, ProgressEvent):
                if event.done:
                    self.chunk_in.set()
                continue
            if self.first_token_at is None:
                self.first_token_at = now
            if isinstance(event, ErrorEvent):
                self.error = event.message
            if isinstance(event, (DoneEvent, ErrorEvent)):
                self.ended_at = now
        self.chunk_in.set()

    def finish(self) -> None:
        self.thread.join()
        if self.error is not None or self.ended_at is None:
            raise UserError(f"bench key-fairness: a request failed: {self.error or 'no reply'}")

    @property
    def ttft(self) -> float:
        return self.first_token_at - self.sent

    @property
    def total(self) -> float:
        return self.ended_at - self.sent


def chat_of_b(tag: str) -> GenerationRequest:
    return GenerationRequest(
        messages=(ChatMessage("user", f"Hi! ({tag})"),),
        cache_namespace=KEY_B,
        use_cache=False,
        sampling=SamplingParams(temperature=0.0, max_tokens=REPLY_TOKENS),
    )


def b_alone(engine: Engine, tag: str) -> float:
    reader = _Reader(engine.submit(chat_of_b(tag)))
    reader.finish()
    return reader.ttft


def b_behind(engine: Engine, prompts: list[GenerationRequest], tag: str) -> dict:
    """A's ``prompts`` sent at once; B's chat once the first has a chunk in."""
    long = [_Reader(engine.submit(replace(p, cache_namespace=KEY_A))) for p in prompts]
    long[0].chunk_in.wait()
    b = _Reader(engine.submit(chat_of_b(tag)))
    b.finish()
    for reader in long:
        reader.finish()
    return {"b_ttft_s": b.ttft, "a_total_s": max(r.ended_at for r in long) - long[0].sent}


def _engines(args) -> dict[str, Engine]:
    from core.cli.progress import print_progress

    root = paths.data_dir(args.data_dir)
    engines: dict[str, Engine] = {}
    try:
        for policy in POLICIES:  # one after the other: the second finds the first's conversions
            engines[policy] = Engine(
                root,
                args.model,
                on_load_progress=None if args.json else print_progress,
                config=EngineConfig(
                    disk_cache=False,
                    pool_tokens=POOL_TOKENS,
                    prefill_sharing=PrefillSharing(round_robin=policy == "shared"),
                ),
            ).start()
            engines[policy].wait_ready()
    except BaseException:
        for engine in engines.values():
            engine.shutdown()
        raise
    return engines


def run_bench_key_fairness(args) -> int:
    if args.repeats < 1 or args.long_tokens < 64 or args.queue < 1 or args.queue_tokens < 64:
        raise UserError(
            "--repeats and --queue must be at least 1, --long-tokens and --queue-tokens at least 64"
        )
    engines = _engines(args)
    runs: list[dict] = []
    try:
        info = engines["shared"].wait_ready()
        if max(args.long_tokens, args.queue_tokens) + 64 > info.context_length:
            raise UserError(
                f"--long-tokens/--queue-tokens do not fit {info.name}'s context "
                f"of {info.context_length}"
            )
        counter = engines["shared"]
        for engine in engines.values():
            b_alone(engine, "warm-up")
        for rep in range(args.repeats):
            announce_repetition("key-fairness", rep, args.repeats)
            single = [long_request(counter, f"long {rep}", args.long_tokens)]
            queue = [
                long_request(counter, f"queued {rep} {i}", args.queue_tokens)
                for i in range(args.queue)
            ]
            run: dict = {policy: {} for policy in POLICIES}
            order = POLICIES if rep % 2 == 0 else POLICIES[::-1]
            for scenario in ("alone", "single", "queue"):
                for policy in order:
                    engine, tag = engines[policy], f"{policy} {scenario} {rep}"
                    if scenario == "alone":
                        run[policy]["alone"] = {"b_ttft_s": b_alone(engine, tag)}
                    else:
                        prompts = single if scenario == "single" else queue
                        run[policy][scenario] = b_behind(engine, prompts, tag)
            runs.append(run)
    finally:
        for engine in engines.values():
            engine.shutdown()
    report = _report(args, info, runs)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


def _report(args, info, runs: list[dict]) -> dict:
    def median(policy: str, scenario: str, key: str) -> float:
        return statistics.median(run[policy][scenario][key] for run in runs)

    figures: dict = {}
    for policy in POLICIES:
        alone = median(policy, "alone", "b_ttft_s")
        figures[policy] = {"alone": {"b_ttft_s": alone}}
        for scenario in ("single", "queue"):
            ttft = median(policy, scenario, "b_ttft_s")
            figures[policy][scenario] = {
                "b_ttft_s": ttft,
                "b_ttft_vs_alone": ttft / alone,
                "a_total_s": median(policy, scenario, "a_total_s"),
            }
    shared = figures["shared"]
    meets = {}
    for scenario in ("single", "queue"):
        ratio = shared[scenario]["a_total_s"] / figures["before"][scenario]["a_total_s"]
        shared[scenario]["a_total_vs_before"] = ratio
        meets[scenario] = {
            "b_ttft": shared[scenario]["b_ttft_s"] <= TARGET_TTFT_S,
            "b_ttft_vs_alone": shared[scenario]["b_ttft_vs_alone"] <= TARGET_TTFT_VS_ALONE,
            "a_total_vs_before": ratio <= TARGET_LONG_TOTAL,
        }
    return {
        "model": info.name,
        "spec": args.model,
        "fingerprint": info.fingerprint,
        "weights_format": info.weights_format,
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "mlx": package_version("mlx"),
            "mlx_lm": package_version("mlx-lm"),
            "load_average": list(os.getloadavg()),
        },
        "repeats": args.repeats,
        "long_tokens": args.long_tokens,
        "queue": args.queue,
        "queue_tokens": args.queue_tokens,
        "method": (
            "engine directly, greedy, prompt cache off, two engines on the same weights taking "
            "turns; key B's chat is sent once key A's first prompt has a chunk in; B's TTFT is "
            "submit to its first token, A's total is submit to its last answer; medians over "
            "repetitions"
        ),
        "figures": figures,
        "targets": {
            "b_ttft_s": TARGET_TTFT_S,
            "b_ttft_vs_alone": TARGET_TTFT_VS_ALONE,
            "a_total_vs_before": TARGET_LONG_TOTAL,
        },
        "meets": meets,
        "runs": runs,
    }


def format_table(report: dict) -> str:
    m, figures = report["machine"], report["figures"]
    lines = [
        f"model: {report['model']} ({report['weights_format']} weights)",
        (
            f"machine: {m['platform']}, {m['cpu_count']} CPUs, load {m['load_average'][0]:.1f}, "
            f"mlx {m['mlx']}; medians of {report['repeats']} repetitions"
        ),
        "",
        f"{'key B behind key A':<32}{'prefill':>9}{'B TTFT (s)':>12}{'x alone':>9}"
        f"{'A total (s)':>13}",
    ]
    cases = (
        ("alone", "nothing"),
        ("single", f"1 prompt of {report['long_tokens']:,} tokens"),
        ("queue", f"{report['queue']} prompts of {report['queue_tokens']:,} tokens"),
    )
    for scenario, what in cases:
        for policy in POLICIES:
            row = figures[policy][scenario]
            lines.append(
                f"{what:<32}{policy:>9}{row['b_ttft_s']:>12.2f}"
                + (
                    f"{row['b_ttft_vs_alone']:>9.2f}{row['a_total_s']:>13.2f}"
                    if scenario != "alone"
                    else ""
                )
            )
    lines.append("")
    targets = report["targets"]
    for scenario, what in cases[1:]:
        row, meets = figures["shared"][scenario], report["meets"][scenario]
        lines.append(
            f"behind {what}: B's TTFT {row['b_ttft_s']:.2f} s (target <= {targets['b_ttft_s']} s, "
            f"<= {targets['b_ttft_vs_alone']}x alone: "
            + ("met" if meets["b_ttft"] and meets["b_ttft_vs_alone"] else "missed")
            + f"); A's total {row['a_total_vs_before']:.2f}x before (target <= "
            f"{targets['a_total_vs_before']}x: "
            + ("met" if meets["a_total_vs_before"] else "missed")
            + ")"
        )
    return "\n".join(lines)
