"""``radixchat bench serve``: aggregate decode throughput of the API, N concurrent
streaming clients against one.

The benchmark starts :class:`core.api.server.ApiServer` in-process on 127.0.0.1 (any free
port) over an engine for the model, sends one warm-up request, then each repetition runs
two rounds, each on fresh prompts:

1. one client: a greedy streaming chat request of ``--max-tokens`` tokens;
2. ``--streams`` clients at once (released together by a barrier), one request each.

Every request has its own system and user message, so requests share no prefix beyond
the template's first few tokens and the radix cache serves (almost) nothing. The clients
are raw ``http.client`` connections reading server-sent events, on threads of this
process. A round's throughput is its completion tokens (summed over its clients, from
each stream's ``usage``) divided by the wall time from the first token any client
received to the last token any client received; medians over repetitions are reported,
and ``throughput_ratio_4_vs_1`` is the N-client median over the one-client median (named
for the issue's target of 4 streams; with another N, ``throughput_ratio_{N}_vs_1`` holds
the same figure). ``stream_overlap`` (the per-stream first-to-last-token spans summed,
over the round's wall time) tells whether the streams decoded side by side (about N) or
one after another (about 1).
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import statistics
import threading
import time
from dataclasses import asdict, dataclass

from bench.harness import announce_repetition, chat_stream, package_version
from core import paths
from core.api.server import ApiServer
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.errors import UserError

POOL_TOKENS = 32768
WARMUP_TOKENS = 8
TOPICS = (
    "the history of the printing press and how it changed Europe",
    "how a steam engine works, from the boiler to the piston",
    "the life cycle of a star, from nebula to white dwarf",
    "why the Roman Empire split in two and what followed",
    "how bees communicate and organise their hive",
    "the causes and the effects of the French Revolution",
    "how vaccines train the immune system",
    "the invention of the telephone and the people behind it",
    "how glaciers shape mountains and valleys",
    "the rise of the Silk Road and the goods it carried",
    "how a compiler turns source code into machine code",
    "the migration of monarch butterflies across North America",
)


@dataclass(frozen=True)
class StreamResult:
    """One streaming request as its client saw it (times from time.perf_counter())."""

    completion_tokens: int
    cached_tokens: int
    finish_reason: str
    sent_at: float
    first_token_at: float
    last_token_at: float

    @property
    def ttft_s(self) -> float:
        return self.first_token_at - self.sent_at

    @property
    def span_s(self) -> float:
        return self.last_token_at - self.first_token_at


@dataclass(frozen=True)
class RoundResult:
    """One round: ``streams`` clients at once."""

    streams: int
    completion_tokens: int
    wall_s: float  # the first token of the round to its last
    tokens_per_s: float  # completion_tokens / wall_s
    stream_overlap: float  # sum of per-stream spans / wall_s: ~1 one after another, ~N side by side
    ttft_s: list[float]
    completion_tokens_each: list[int]
    cached_tokens_each: list[int]
    finish_reasons: list[str]


def streams_text(streams: int) -> str:
    return f"{streams} stream{'s' if streams > 1 else ''}"


def prompt_messages(number: int) -> list[dict[str, str]]:
    """The chat of request ``number``: its own system and user message, no shared prefix."""
    topic = TOPICS[number % len(TOPICS)]
    return [
        {"role": "system", "content": f"Request {number}. You are a knowledgeable writer."},
        {"role": "user", "content": f"Write a long, detailed essay about {topic}."},
    ]


def stream_chat(
    host: str,
    port: int,
    messages: list[dict[str, str]],
    max_tokens: int,
    start: threading.Barrier | None = None,
) -> StreamResult:
    """One greedy streaming chat request over a raw connection; waits on ``start`` first."""
    body = json.dumps(
        {
            "messages": messages,
            "max_tokens": max_tokens,  # no model: the one served
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    conn = http.client.HTTPConnection(host, port, timeout=600)
    try:
        conn.connect()
        if start is not None:
            start.wait()
        sent_at = time.perf_counter()
        stamps: list[float] = []
        usage, reason, finished_at = None, None, None
        for now, chunk in chat_stream(conn, body, "serve"):
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", ()):
                delta = choice.get("delta") or {}
                # a piece of the reply (mlx_lm.server sends the role with every piece, and the
                # last piece with the end)
                if delta.get("content") or delta.get("tool_calls"):
                    stamps.append(now)
                if choice.get("finish_reason"):
                    reason, finished_at = choice["finish_reason"], now
    finally:
        conn.close()
    if not stamps and finished_at is not None:  # one token, and it was the end (no text)
        stamps = [finished_at]
    if usage is None or not stamps:
        raise UserError("bench serve: a stream ended without its tokens or usage")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return StreamResult(
        usage["completion_tokens"], cached, reason or "?", sent_at, stamps[0], stamps[-1]
    )


def run_round(
    host: str, port: int, first_number: int, streams: int, max_tokens: int
) -> RoundResult:
    """``streams`` clients released together on the server at ``host:port``, requests
    ``first_number`` onwards."""
    start = threading.Barrier(streams)
    results: list[StreamResult | None] = [None] * streams
    errors: list[BaseException] = []

    def client(index: int) -> None:
        try:
            results[index] = stream_chat(
                host, port, prompt_messages(first_number + index), max_tokens, start
            )
        except BaseException as exc:  # handed to the main thread
            errors.append(exc)
            start.abort()

    threads = [
        threading.Thread(target=client, args=(i,), name=f"bench-serve-client-{i}")
        for i in range(streams)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        first = next(
            (e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0]
        )
        raise first
    done = [r for r in results if r is not None]
    wall = max(r.last_token_at for r in done) - min(r.first_token_at for r in done)
    tokens = sum(r.completion_tokens for r in done)
    return RoundResult(
        streams=streams,
        completion_tokens=tokens,
        wall_s=wall,
        tokens_per_s=tokens / wall if wall > 0 else 0.0,
        stream_overlap=sum(r.span_s for r in done) / wall if wall > 0 else 0.0,
        ttft_s=[r.ttft_s for r in done],
        completion_tokens_each=[r.completion_tokens for r in done],
        cached_tokens_each=[r.cached_tokens for r in done],
        finish_reasons=[r.finish_reason for r in done],
    )


def stream_counts(args) -> list[int]:
    """The rounds' client counts: 1, then ``--streams`` (4, or 4 and 8 with ``--against``),
    checked along with the other arguments."""
    counts = args.streams or ([4, 8] if getattr(args, "against", None) else [4])
    for name, value in (
        ("streams", min(counts)),
        ("max_tokens", args.max_tokens),
        ("repeats", args.repeats),
    ):
        if value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_tokens < 2:
        raise UserError("--max-tokens must be at least 2 (decode throughput needs two tokens)")
    return sorted({1, *counts})


def run_bench_serve(args) -> int:
    counts = stream_counts(args)
    from core.cli.progress import print_progress

    root = paths.data_dir(args.data_dir)
    engine = Engine(
        root,
        args.model,
        on_load_progress=print_progress,
        config=EngineConfig(pool_tokens=POOL_TOKENS, disk_cache=False),
    ).start()
    server = None
    rounds: dict[int, list[RoundResult]] = {n: [] for n in counts}
    try:
        info = engine.wait_ready()
        server = ApiServer(engine, "127.0.0.1", 0).start()
        number = 0
        stream_chat(server.host, server.port, prompt_messages(number), WARMUP_TOKENS)
        number += 1
        for rep in range(args.repeats):
            for streams in counts:
                announce_repetition("serve", rep, args.repeats, streams_text(streams))
                rounds[streams].append(
                    run_round(server.host, server.port, number, streams, args.max_tokens)
                )
                number += streams
    finally:
        if server is not None:
            server.stop()
        engine.shutdown()
    report = _report(args, info, rounds)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "mlx": package_version("mlx"),
        "mlx_lm": package_version("mlx-lm"),
    }


def _report(args, info, rounds: dict[int, list[RoundResult]]) -> dict:
    counts = sorted(rounds)
    many = [n for n in counts if n > 1]

    def median(streams: int, field: str) -> float:
        return statistics.median(getattr(r, field) for r in rounds[streams])

    tps = {n: median(n, "tokens_per_s") for n in counts}
    report = {
        "model": info.name,
        "spec": args.model,
        "fingerprint": info.fingerprint,
        "weights_format": info.weights_format,
        "machine": machine(),
        "streams": many[0] if many else 1,
        "stream_counts": counts,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "pool_tokens": POOL_TOKENS,
        "method": (
            "greedy streaming chat requests over raw HTTP to an in-process ApiServer; a round's "
            "throughput = completion tokens summed over its clients / (last token - first token "
            "of the round); medians over repetitions"
        ),
        "rounds": {str(s): [asdict(r) for r in rs] for s, rs in rounds.items()},
        "tokens_per_s": {str(n): tps[n] for n in counts},
        "per_stream_tokens_per_s": {str(n): tps[n] / n for n in counts},
        "wall_s": {str(n): median(n, "wall_s") for n in counts},
        "stream_overlap": {str(n): median(n, "stream_overlap") for n in counts},
        "ttft_s_median": {
            str(s): statistics.median(t for r in rs for t in r.ttft_s) for s, rs in rounds.items()
        },
    }
    ratios = {n: tps[n] / tps[1] if tps[1] > 0 else None for n in many}
    for n in many:
        if n != 4:
            report[f"throughput_ratio_{n}_vs_1"] = ratios[n]
    # named for the target of 4 streams; with other counts, the first one's ratio
    report["throughput_ratio_4_vs_1"] = ratios.get(4, ratios[many[0]] if many else None)
    return report


def format_table(report: dict) -> str:
    m = report["machine"]
    lines = [
        (
            f"model: {report['model']} ({report['weights_format']} weights, fingerprint "
            f"{report['fingerprint'][:16]})"
        ),
        f"machine: {m['platform']}, {m['cpu_count']} CPUs, mlx {m['mlx']}, mlx-lm {m['mlx_lm']}",
        (
            f"{report['max_tokens']} greedy tokens per request, medians of {report['repeats']} "
            f"repetitions; KV pool {report['pool_tokens']} tokens"
        ),
        "",
        (
            f"{'clients':>8}{'tok/s (sum)':>13}{'tok/s each':>12}{'wall (s)':>10}{'overlap':>9}"
            f"{'TTFT (s)':>10}"
        ),
    ]
    for streams in map(str, report["stream_counts"]):
        lines.append(
            f"{streams:>8}{report['tokens_per_s'][streams]:>13.1f}"
            f"{report['per_stream_tokens_per_s'][streams]:>12.1f}{report['wall_s'][streams]:>10.2f}"
            f"{report['stream_overlap'][streams]:>9.2f}{report['ttft_s_median'][streams]:>10.3f}"
        )
    lines.append("")
    for n in report["stream_counts"][1:]:
        ratio = report.get(f"throughput_ratio_{n}_vs_1", report["throughput_ratio_4_vs_1"])
        lines.append(
            f"aggregate throughput, {n} clients / 1 client: "
            + (f"{ratio:.2f}x" if ratio is not None else "n/a")
        )
    return "\n".join(lines)
