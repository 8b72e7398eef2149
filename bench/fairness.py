"""``radixchat bench fairness``: does one client's long prompt stop another client's stream?

On the engine directly (no HTTP), greedy, the prompt cache off so every prompt is computed.
After a warm-up request, each repetition runs, on prompts of its own:

1. the stream alone: one client streams ``--max-tokens`` tokens (the model continues a
   count, so the reply does not end early); its inter-token gaps are the arrival times of its token
   events, one after the other, as its reading thread sees them;
2. the long prompt alone: a ``--long-tokens`` prompt (about 3,000 tokens by default), one
   token of reply; its time to first token is from submit to its reply's end;
3. both: the stream starts, and once it has its first few tokens the long prompt is sent.
   The stream's gaps are those from its last token before the long prompt was sent to its
   second token after the long prompt was answered; the long prompt's time to first token
   as in 2.

Reported: the stream's gaps (p50, p99, max) alone and beside the long prompt, the long
prompt's time to first token beside the stream over alone, and how many tokens the stream
received while the long prompt was prefilled; medians over repetitions. The targets (issue
19): max gap at most 1 s, long-prompt TTFT at most 1.3x its solo prefill.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import threading
import time

from bench.harness import package_version, repetitions
from core import paths
from core.engine.config import EngineConfig
from core.engine.engine import Engine, RequestHandle
from core.engine.types import (
    ChatMessage,
    DoneEvent,
    ErrorEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from core.errors import UserError

POOL_TOKENS = 16384
LEAD_TOKENS = 4  # the stream's tokens before the long prompt is sent
TAIL_TOKENS = 2  # the stream's tokens after the long prompt's answer that still count
TARGET_MAX_GAP_S = 1.0
TARGET_TTFT_RATIO = 1.3
WORDS = (
    "amber",
    "river",
    "quiet",
    "lantern",
    "orchard",
    "copper",
    "meadow",
    "harbor",
    "violet",
    "canyon",
    "ember",
    "glacier",
    "willow",
    "saffron",
    "thunder",
    "marble",
    "falcon",
    "juniper",
    "cobalt",
    "prairie",
)


def _greedy(messages: tuple[ChatMessage, ...], max_tokens: int) -> GenerationRequest:
    return GenerationRequest(
        messages=messages,
        use_cache=False,
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )


def stream_request(tag: str, max_tokens: int) -> GenerationRequest:
    """A reply that keeps going: the continuation of a count (raw text, no chat template: a
    chat reply may end after a few lines)."""
    count = "\n".join(str(n) for n in range(1, 21))
    return GenerationRequest(
        prompt_text=f"({tag}) Numbers, one per line:\n{count}\n",
        use_cache=False,
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )


def long_messages(tag: str, sentences: int) -> tuple[ChatMessage, ...]:
    lines = [
        f"Note {i} ({tag}): the {WORDS[i % 20]} {WORDS[(7 * i + 3) % 20]} crossed {i * 13 % 97} "
        f"{WORDS[(3 * i + 11) % 20]} fields."
        for i in range(sentences)
    ]
    return (
        ChatMessage(
            "user", "Here are my notes.\n" + "\n".join(lines) + "\nSummarise them in one line."
        ),
    )


def long_request(engine: Engine, tag: str, tokens: int) -> GenerationRequest:
    """A prompt of about ``tokens`` tokens (chat template included), one token of reply."""

    def count(n: int) -> int:
        return engine.count_tokens(_greedy(long_messages(tag, n), 1))

    low, high = 1, 2
    while count(high) < tokens:
        low, high = high, high * 2
    while high - low > 1:  # the most sentences that stay within ``tokens``
        mid = (low + high) // 2
        low, high = (mid, high) if count(mid) <= tokens else (low, mid)
    return _greedy(long_messages(tag, low), 1)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def gap_figures(stamps: list[float]) -> dict:
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    if not gaps:
        raise UserError("bench fairness: the stream gave fewer than two tokens")
    return {
        "gap_p50_s": _percentile(gaps, 0.5),
        "gap_p99_s": _percentile(gaps, 0.99),
        "gap_max_s": max(gaps),
        "gaps": len(gaps),
    }


class _Reader:
    """Reads one request's events on its own thread, stamping each token's arrival."""

    def __init__(self, handle: RequestHandle):
        self.handle = handle
        self.stamps: list[float] = []
        self.done: DoneEvent | None = None
        self.error: str | None = None
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, name="bench-fairness-reader", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for event in self.handle.events(timeout=3600):
            now = time.perf_counter()
            with self.changed:
                if isinstance(event, TokenEvent) and event.text:
                    self.stamps.append(now)
                elif isinstance(event, DoneEvent):
                    self.done = event
                elif isinstance(event, ErrorEvent):
                    self.error = event.message
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait(self, condition) -> None:
        with self.changed:
            self.changed.wait_for(
                lambda: condition() or self.done is not None or self.error is not None
            )
        if self.error is not None:
            raise UserError(f"bench fairness: a request failed: {self.error}")


def _ttft(engine: Engine, request: GenerationRequest) -> tuple[float, int]:
    """Submit to the end of a one-token reply, and the prompt's tokens."""
    sent = time.perf_counter()
    reader = _Reader(engine.submit(request))
    reader.wait(lambda: False)
    reader.thread.join()
    return time.perf_counter() - sent, reader.done.stats.prompt_tokens


def one_repetition(
    engine: Engine, rep: int, long_tokens: int, max_tokens: int, context: int
) -> dict:
    solo = _Reader(engine.submit(stream_request(f"solo {rep}", max_tokens)))
    solo.wait(lambda: False)
    solo_gaps = gap_figures(solo.stamps)
    solo_ttft, prompt_tokens = _ttft(engine, long_request(engine, f"alone {rep}", long_tokens))

    long = long_request(engine, f"beside {rep}", long_tokens)
    stream = _Reader(engine.submit(stream_request(f"beside {rep}", max(8, context - 256))))
    try:
        stream.wait(lambda: len(stream.stamps) >= LEAD_TOKENS)
        first = len(stream.stamps) - 1  # the stream's last token before the long prompt
        sent = time.perf_counter()
        answer = _Reader(engine.submit(long))
        answer.wait(lambda: False)
        together_ttft = time.perf_counter() - sent
        with stream.changed:
            last = len(stream.stamps) - 1 + TAIL_TOKENS
        stream.wait(lambda: len(stream.stamps) > last)
    finally:
        stream.handle.cancel()
    stream.thread.join()
    during = [t for t in stream.stamps if sent < t <= sent + together_ttft]
    ended = stream.done is not None and stream.done.stats.finish_reason != "cancelled"
    return {
        "solo": {**solo_gaps, "long_ttft_s": solo_ttft},
        "together": {
            **gap_figures(stream.stamps[first : last + 1]),
            "long_ttft_s": together_ttft,
            "stream_tokens_during_prefill": len(during),
            "stream_ended_early": ended,
        },
        "long_prompt_tokens": prompt_tokens,
    }


def run_bench_fairness(args) -> int:
    if args.repeats < 1 or args.max_tokens < 8 or args.long_tokens < 64:
        raise UserError(
            "--repeats must be at least 1, --max-tokens at least 8 and --long-tokens at least 64"
        )
    from core.cli.progress import print_progress

    engine = Engine(
        paths.data_dir(args.data_dir),
        args.model,
        on_load_progress=print_progress,
        config=EngineConfig(disk_cache=False, pool_tokens=POOL_TOKENS),
    ).start()
    runs = []
    try:
        info = engine.wait_ready()
        if args.long_tokens + 64 > info.context_length:
            raise UserError(
                f"--long-tokens {args.long_tokens} does not fit {info.name}'s context "
                f"of {info.context_length}"
            )
        _ttft(engine, stream_request("warm-up", 1))
        for rep in repetitions("fairness", args.repeats):
            runs.append(
                one_repetition(engine, rep, args.long_tokens, args.max_tokens, info.context_length)
            )
    finally:
        engine.shutdown()
    report = _report(args, info, runs)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


def _report(args, info, runs: list[dict]) -> dict:
    def median(side: str, key: str) -> float:
        return statistics.median(run[side][key] for run in runs)

    figures = {
        side: {
            key: median(side, key) for key in ("gap_p50_s", "gap_p99_s", "gap_max_s", "long_ttft_s")
        }
        for side in ("solo", "together")
    }
    figures["together"]["stream_tokens_during_prefill"] = median(
        "together", "stream_tokens_during_prefill"
    )
    ratio = figures["together"]["long_ttft_s"] / figures["solo"]["long_ttft_s"]
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
        "max_tokens": args.max_tokens,
        "long_tokens": args.long_tokens,
        "long_prompt_tokens": statistics.median(run["long_prompt_tokens"] for run in runs),
        "method": (
            "engine directly, greedy, prompt cache off; a stream's gaps are its token events' "
            "arrival times; the long prompt's TTFT is submit to its one-token reply; medians "
            "over repetitions"
        ),
        "solo": figures["solo"],
        "together": figures["together"],
        "ttft_ratio": ratio,
        "targets": {"max_gap_s": TARGET_MAX_GAP_S, "ttft_ratio": TARGET_TTFT_RATIO},
        "meets": {
            "max_gap": figures["together"]["gap_max_s"] <= TARGET_MAX_GAP_S,
            "ttft_ratio": ratio <= TARGET_TTFT_RATIO,
        },
        "runs": runs,
    }


def format_table(report: dict) -> str:
    m, solo, both = report["machine"], report["solo"], report["together"]
    lines = [
        (
            f"model: {report['model']} ({report['weights_format']} weights, fingerprint "
            f"{report['fingerprint'][:16]})"
        ),
        (
            f"machine: {m['platform']}, {m['cpu_count']} CPUs, load {m['load_average'][0]:.1f}, "
            f"mlx {m['mlx']}"
        ),
        (
            f"a stream beside a {report['long_prompt_tokens']:.0f}-token prompt, medians of "
            f"{report['repeats']} repetitions"
        ),
        "",
        f"{'':>22}{'gap p50 (s)':>13}{'gap p99 (s)':>13}{'gap max (s)':>13}{'long TTFT (s)':>15}",
    ]
    for name, side in (("alone", solo), ("beside each other", both)):
        lines.append(
            f"{name:>22}{side['gap_p50_s']:>13.3f}{side['gap_p99_s']:>13.3f}"
            f"{side['gap_max_s']:>13.3f}{side['long_ttft_s']:>15.2f}"
        )
    lines += [
        "",
        (
            "stream tokens while the long prompt was prefilled: "
            f"{both['stream_tokens_during_prefill']:.0f}"
        ),
        f"max gap {both['gap_max_s']:.2f} s (target <= {report['targets']['max_gap_s']} s): "
        + ("met" if report["meets"]["max_gap"] else "missed"),
        f"long-prompt TTFT {report['ttft_ratio']:.2f}x its solo prefill (target <= "
        f"{report['targets']['ttft_ratio']}x): "
        + ("met" if report["meets"]["ttft_ratio"] else "missed"),
    ]
    return "\n".join(lines)
