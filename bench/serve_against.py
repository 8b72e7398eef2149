"""``radixchat bench serve --against mlx-lm``: our API server and ``mlx_lm.server`` side by
side, aggregate decode throughput at 1 and N concurrent streaming clients.

Both servers run as subprocesses at once on loopback (:mod:`bench.server_process`),
with the same CPU setup, on the same weights: the model is loaded the way our engine
loads it and saved as an MLX folder for ``mlx_lm.server``
(:func:`bench.agent.save_mlx_folder`; it reads no GGUF). Our server is
``radixchat serve`` over a fresh data folder holding links to the models (so its caches
start empty). The clients are those of :mod:`bench.serve`: greedy streaming chat
requests over raw HTTP, fresh prompts each round, released together; a round's
throughput is its completion tokens over the time from its first token to its last.

The machine is shared and noisy, so the two servers take turns run by run: for each
repetition and each client count, one round on each server with the same prompts (which
goes first alternates between repetitions). The report gives each server's median
tokens/s per client count and the median over repetitions of the ratio ours / theirs of
the two rounds run back to back (``ratio_ours_vs_mlx_lm``), against the issue's targets.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict

from bench.harness import announce_repetition
from bench.serve import (
    POOL_TOKENS,
    WARMUP_TOKENS,
    RoundResult,
    machine,
    prompt_messages,
    run_round,
    stream_chat,
    stream_counts,
    streams_text,
)
from bench.side_by_side import mlx_folder_and_data, ours_and_mlx_lm
from core import paths

SERVERS = ("ours", "mlx_lm")
TARGETS = {1: 1.0, 4: 1.1, 8: 1.1}  # ours / mlx_lm.server, issue 19


def run_bench_serve_against(args) -> int:
    counts = stream_counts(args)
    root = paths.data_dir(args.data_dir)
    rounds: dict[str, dict[int, list[RoundResult]]] = {s: {n: [] for n in counts} for s in SERVERS}
    with (
        mlx_folder_and_data(root, args.model, "serve") as (mlx_folder, data),
        ours_and_mlx_lm(args.model, data, mlx_folder, POOL_TOKENS) as (ours, theirs),
    ):
        servers = {"ours": ours, "mlx_lm": theirs}
        for server in servers.values():  # what loads lazily, loaded
            stream_chat(server.host, server.port, prompt_messages(0), WARMUP_TOKENS)
        number = 1
        for rep in range(args.repeats):
            order = SERVERS if rep % 2 == 0 else SERVERS[::-1]
            for streams in counts:
                for name in order:
                    announce_repetition(
                        "serve", rep, args.repeats, f"{streams_text(streams)}, {name}"
                    )
                    server = servers[name]
                    rounds[name][streams].append(
                        run_round(server.host, server.port, number, streams, args.max_tokens)
                    )
                number += streams  # both servers get the same prompts in a run
    report = against_report(args, counts, rounds)
    print(json.dumps(report, indent=2) if args.json else format_against(report))
    return 0


def against_report(
    args, counts: list[int], rounds: dict[str, dict[int, list[RoundResult]]]
) -> dict:
    def tps(name: str, n: int) -> float:
        return statistics.median(r.tokens_per_s for r in rounds[name][n])

    def paired(n: int) -> float | None:
        ratios = [
            a.tokens_per_s / b.tokens_per_s
            for a, b in zip(rounds["ours"][n], rounds["mlx_lm"][n])
            if b.tokens_per_s > 0
        ]
        return statistics.median(ratios) if ratios else None

    return {
        "model": args.model,
        "against": "mlx_lm.server",
        "machine": machine(),
        "stream_counts": counts,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "pool_tokens": POOL_TOKENS,
        "method": (
            "both servers as subprocesses with the same CPU setup and weights (ours: radixchat "
            "serve on the GGUF; theirs: mlx_lm.server on it saved as an MLX folder); greedy "
            "streaming chat requests over raw HTTP; a round's throughput = completion tokens "
            "summed over its clients / (last token - first token of the round); the servers take "
            "turns round by round with the same prompts; medians over repetitions"
        ),
        "rounds": {
            name: {str(n): [asdict(r) for r in rs] for n, rs in by.items()}
            for name, by in rounds.items()
        },
        "completion_tokens": {
            name: {
                str(n): statistics.median(r.completion_tokens for r in rounds[name][n])
                for n in counts
            }
            for name in SERVERS
        },
        "ttft_s_median": {
            name: {
                str(n): statistics.median(t for r in rounds[name][n] for t in r.ttft_s)
                for n in counts
            }
            for name in SERVERS
        },
        "tokens_per_s": {name: {str(n): tps(name, n) for n in counts} for name in SERVERS},
        "targets": {str(n): TARGETS[n] for n in counts if n in TARGETS},
        "ratio_ours_vs_mlx_lm": {str(n): paired(n) for n in counts},
    }


def format_against(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"model: {report['model']}; {report['max_tokens']} greedy tokens per request; medians of "
        f"{report['repeats']} repetitions, the two servers interleaved",
        f"machine: {m['platform']}, {m['cpu_count']} CPUs, mlx {m['mlx']}, mlx-lm {m['mlx_lm']}",
        "",
        f"{'clients':>8}{'ours tok/s':>12}{'mlx_lm tok/s':>14}{'ours/mlx_lm':>13}{'target':>8}",
    ]
    for n in map(str, report["stream_counts"]):
        ratio = report["ratio_ours_vs_mlx_lm"][n]
        target = report["targets"].get(n)
        lines.append(
            (
                f"{n:>8}{report['tokens_per_s']['ours'][n]:>12.1f}"
                f"{report['tokens_per_s']['mlx_lm'][n]:>14.1f}"
            )
            + (f"{ratio:>12.2f}x" if ratio is not None else f"{'n/a':>13}")
            + (f"{target:>7.1f}x" if target is not None else "")
        )
    return "\n".join(lines)
