"""``radixchat bench followup``: a follow-up's new tokens prefilled on top of a cached
prefix, our server against ``mlx_lm.server``, time to first token.

What an agent does every turn: re-send its conversation (cached by the server) with a tool
result or a message of a few hundred new tokens at its end. For each prefix size (tokens
of the conversation so far) and each follow-up size (new tokens), each server gets a fresh
conversation (its first line is unique: nothing of it is cached), primed with one request
of one greedy token (the cache now holds it), then the follow-up: the same messages, a
short assistant turn and a user message of the follow-up's size, streamed greedy. Its
TTFT, on the client, is the time from sending it to the first streamed piece of text; the
cached tokens are what the server's usage says its cache served (the table shows both
servers', which should be equal: the same tokens computed).

Both servers run at once as subprocesses on loopback with the same CPU setup and weights
(:mod:`bench.server_process`; ``mlx_lm.server`` on the model saved as an MLX
folder, as ``bench agent`` does), through ``/v1/chat/completions``; which server goes first
alternates from one conversation to the next. The machine is shared: the report gives,
per cell, each server's median TTFT over the repetitions and the median of the per-pair
ratios ours / theirs (each pair run back to back), with the load average around the run.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass

from bench.agent import CHAT, Reply, Served, stream, warm_up
from bench.harness import TRAVEL_NOTES, announce_repetition
from bench.serve import machine
from bench.side_by_side import mlx_folder_and_data, ours_and_mlx_lm
from core import paths
from core.errors import UserError

POOL_TOKENS = 65536
TARGET = 1.0  # ours / mlx_lm.server, issue 32
QUESTION = "Read these notes; I will add more."
ANSWER = "Noted."


@dataclass(frozen=True)
class Conversation:
    """One cell's requests: the priming one (the prefix) and the follow-up."""

    prime: list[dict]
    follow_up: list[dict]


@dataclass(frozen=True)
class Pair:
    """One follow-up on each server, run back to back."""

    prefix_tokens: int  # asked for
    new_tokens: int  # asked for
    ours: Reply
    theirs: Reply

    @property
    def ratio(self) -> float:
        return self.ours.ttft_s / self.theirs.ttft_s


def _notes(header: str, lines: int) -> str:
    return header + "\n" + "\n".join(f"- {TRAVEL_NOTES[i % 4]}" for i in range(lines))


def _sized(count, build, tokens: int) -> str:
    """The text ``build(lines)`` whose messages ``count`` to ``tokens`` tokens or just over."""
    lines = 1
    while count(build(lines)) < tokens:  # a few steps: grow by what is missing
        per_line = max(1, count(build(lines)) - count(build(0))) / lines
        lines += max(1, int((tokens - count(build(lines))) / per_line))
    while lines > 1 and count(build(lines - 1)) >= tokens:
        lines -= 1
    return build(lines)


def conversation(tokenizer, number: int, prefix_tokens: int, new_tokens: int) -> Conversation:
    """Conversation ``number``: a system prompt of travel notes making the priming prompt
    ``prefix_tokens`` long, and a follow-up ``new_tokens`` longer than it."""

    def count(messages: list[dict]) -> int:
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    def prime(text: str) -> list[dict]:
        return [{"role": "system", "content": text}, {"role": "user", "content": QUESTION}]

    system = _sized(
        lambda text: count(prime(text)),
        lambda n: _notes(f"Trip {number}: notes for the traveller.", n),
        prefix_tokens,
    )
    first = prime(system)
    start = count(first)

    def follow(text: str) -> list[dict]:
        return [*first, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": text}]

    more = _sized(
        lambda text: count(follow(text)) - start,
        lambda n: _notes(f"Day {number}: more notes.", n),
        new_tokens,
    )
    return Conversation(first, follow(more))


def _body(messages: list[dict], max_tokens: int) -> dict:
    return {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def run_pairs(servers: list[Served], conversations, max_tokens: int, repeats: int) -> list[Pair]:
    """Each conversation to each server (primed, then its follow-up timed), the order of
    the two servers alternating; ``conversations``: (rep, prefix, new, Conversation)."""
    pairs = []
    for number, (rep, prefix, new, talk) in enumerate(conversations):
        announce_repetition("followup", rep, repeats, f"prefix {prefix}, {new} new tokens")
        order = servers if number % 2 == 0 else servers[::-1]
        replies = {}
        for server in order:
            stream(server.host, server.port, CHAT, _body(talk.prime, 1))
            replies[server.name] = stream(
                server.host, server.port, CHAT, _body(talk.follow_up, max_tokens)
            )
        pairs.append(Pair(prefix, new, replies["ours"], replies["mlx_lm"]))
    return pairs


def run_bench_followup(args) -> int:
    if args.repeats < 1 or args.max_tokens < 1:
        raise UserError("--repeats and --max-tokens must be at least 1")
    from mlx_lm.utils import load_tokenizer

    root = paths.data_dir(args.data_dir)
    load = [os.getloadavg()[0]]
    with mlx_folder_and_data(root, args.model, "followup") as (mlx_folder, data):
        tokenizer = load_tokenizer(mlx_folder)
        cells = [(p, n) for p in args.prefix_tokens for n in args.new_tokens]
        conversations = [
            (rep, p, n, conversation(tokenizer, rep * len(cells) + i, p, n))
            for rep in range(args.repeats)
            for i, (p, n) in enumerate(cells)
        ]
        with ours_and_mlx_lm(args.model, data, mlx_folder, POOL_TOKENS, stop_timeout_s=60) as (
            ours,
            theirs,
        ):
            servers = [
                Served("ours", ours.host, ours.port, CHAT, None),
                Served("mlx_lm", theirs.host, theirs.port, CHAT, None),
            ]
            for server in servers:
                warm_up(server)
            load.append(os.getloadavg()[0])
            pairs = run_pairs(servers, conversations, args.max_tokens, args.repeats)
            load.append(os.getloadavg()[0])
    report = followup_report(args, pairs, load)
    print(json.dumps(report, indent=2) if args.json else format_followup(report))
    return 0


def followup_report(args, pairs: list[Pair], load: list[float]) -> dict:
    cells = []
    for prefix in args.prefix_tokens:
        for new in args.new_tokens:
            mine = [p for p in pairs if p.prefix_tokens == prefix and p.new_tokens == new]
            cells.append(
                {
                    "prefix_tokens": prefix,
                    "new_tokens": new,
                    "prompt_tokens": [p.ours.prompt_tokens for p in mine],
                    "cached_tokens": {
                        "ours": [p.ours.cached_tokens for p in mine],
                        "mlx_lm": [p.theirs.cached_tokens for p in mine],
                    },
                    "ttft_s_median": {
                        "ours": statistics.median(p.ours.ttft_s for p in mine),
                        "mlx_lm": statistics.median(p.theirs.ttft_s for p in mine),
                    },
                    "ratio_ours_vs_mlx_lm": statistics.median(p.ratio for p in mine),
                    "replies_same": all(p.ours.text == p.theirs.text for p in mine),
                }
            )
    return {
        "model": args.model,
        "against": "mlx_lm.server",
        "machine": machine(),
        "load_1min": [round(x, 2) for x in load],  # before, after loading, after the pairs
        "repeats": args.repeats,
        "max_tokens": args.max_tokens,
        "method": (
            "both servers as subprocesses with the same CPU setup and weights, through "
            "/v1/chat/completions; per cell and repetition a fresh conversation primed with one "
            "request (1 greedy token), then its follow-up streamed greedy; TTFT = send to first "
            "streamed text, on the client; the servers alternate which goes first; medians over "
            "repetitions, the ratio the median of the back-to-back pairs' ratios"
        ),
        "pairs": [
            {
                "prefix_tokens": p.prefix_tokens,
                "new_tokens": p.new_tokens,
                "ours": asdict(p.ours),
                "mlx_lm": asdict(p.theirs),
            }
            for p in pairs
        ],
        "cells": cells,
        "cached_tokens_equal": all(
            c["cached_tokens"]["ours"] == c["cached_tokens"]["mlx_lm"] for c in cells
        ),
        "target": TARGET,
        "ratio_ours_vs_mlx_lm_median": statistics.median(p.ratio for p in pairs),
    }


def format_followup(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"model: {report['model']}; follow-ups of {report['max_tokens']} greedy tokens; medians "
        f"of {report['repeats']} repetitions, the two servers interleaved; load "
        f"{report['load_1min']}",
        f"machine: {m['platform']}, {m['cpu_count']} CPUs, mlx {m['mlx']}, mlx-lm {m['mlx_lm']}",
        "",
        f"{'prefix':>7}{'new':>5}{'cached ours':>13}{'cached mlx_lm':>15}{'TTFT ours':>11}"
        f"{'TTFT mlx_lm':>13}{'ours/mlx_lm':>13}",
    ]
    for c in report["cells"]:
        lines.append(
            f"{c['prefix_tokens']:>7}{c['new_tokens']:>5}"
            f"{_tokens(c['cached_tokens']['ours']):>13}{_tokens(c['cached_tokens']['mlx_lm']):>15}"
            f"{c['ttft_s_median']['ours']:>10.3f}s{c['ttft_s_median']['mlx_lm']:>12.3f}s"
            f"{c['ratio_ours_vs_mlx_lm']:>12.3f}x"
        )
    lines += [
        "",
        f"ours / mlx_lm.server, median over every pair: "
        f"{report['ratio_ours_vs_mlx_lm_median']:.3f}x (target <= {report['target']:.1f}); "
        f"cached tokens equal: {report['cached_tokens_equal']}",
    ]
    return "\n".join(lines)


def _tokens(counts: list[int | None]) -> str:
    """The cached tokens of a cell's repetitions: one figure when they agree."""
    seen = sorted({c for c in counts if c is not None})
    return "n/a" if not seen else str(seen[0]) if len(seen) == 1 else f"{seen[0]}-{seen[-1]}"
