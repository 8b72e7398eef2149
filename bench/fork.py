"""``radixchat bench fork``: the first reply of a branch (issue 45.4), against recomputing the
history it shares, in RAM and after a restart.

A branch is a new chat holding the history of another (the window's "Branch", an edit of an
earlier message, the API's conversation forks): the same tokens, which the radix tree holds
already. Per repetition the bench builds a greedy chat of ``--turns`` turns (its user
messages travel notes, the chat's first line unique: nothing of it is cached before), then
asks the branch's first question three ways on the same in-process engine and weights:

- **RAM**: a new session whose prompt is the history and the new question (the history is
  in the prefix cache);
- **recompute**: the same prompt with the cache off (``use_cache=False``: what a chat app
  without a prefix cache pays);
- **disk**: after a restart (the engine shut down and started again on the same data
  folder, its RAM empty), another branch of the same history (another question, as long):
  the history comes back from the disk cache.

Reported: each way's TTFT (the engine's own, submit to first token) and the tokens the cache
served, medians over the repetitions, and recompute / RAM, recompute / disk.
"""

from __future__ import annotations

import json
import os
import statistics

from bench.harness import ask_greedy, link_models, repetitions, scratch_data_folder, travel_notes
from bench.serve import machine
from core import paths
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ChatMessage, DoneEvent
from core.errors import UserError

REPLY_TOKENS = 24  # each turn's reply while the chat is built
QUESTION = "Which of these would you do first, and why?"
# after the restart, another branch of the same history (the first one's own prompt is on
# disk too: asking it again would time a restore of the whole prompt, not of the history)
QUESTION_AFTER = "Which of these would you skip, and why?"


def _start(data, args) -> Engine:
    from core.cli.progress import print_progress

    engine = Engine(
        data,
        args.model,
        on_load_progress=None if args.json else print_progress,
        config=EngineConfig(pool_tokens=args.pool_tokens),
    ).start()
    engine.wait_ready()
    return engine


def build_chat(engine: Engine, rep: int, turns: int, lines: int) -> list[ChatMessage]:
    """A greedy chat of ``turns`` turns (session ``chat-REP``): its messages, replies included."""
    history: list[ChatMessage] = []
    for turn in range(turns):
        opening = f"Trip {rep}, day {turn + 1}. " if turn == 0 else f"Day {turn + 1}. "
        history.append(ChatMessage("user", opening + "My notes:\n" + travel_notes(lines)))
        done = ask_greedy(engine, history, "fork", session=f"chat-{rep}", max_tokens=REPLY_TOKENS)
        history.append(ChatMessage("assistant", done.text))
    return history


def _way(done: DoneEvent) -> dict:
    stats = done.stats
    return {
        "ttft_s": stats.ttft_s,
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "restored_tokens": stats.restored_tokens,
        "computed_tokens": stats.computed_tokens,
    }


def run_bench_fork(args) -> int:
    if args.repeats < 1 or args.turns < 1 or args.lines < 1:
        raise UserError("--repeats, --turns and --lines must be at least 1")
    root = paths.data_dir(args.data_dir)
    load = [os.getloadavg()[0]]
    runs: list[dict] = []
    with scratch_data_folder(root, "fork") as data:
        link_models(root, data)
        engine = _start(data, args)
        forks = []
        try:
            ask_greedy(engine, [ChatMessage("user", "Hello")], "fork", max_tokens=1)  # warm-up
            for rep in repetitions("fork", args.repeats):
                history = build_chat(engine, rep, args.turns, args.lines)
                fork = [*history, ChatMessage("user", QUESTION)]
                forks.append(fork)
                ram = ask_greedy(engine, fork, "fork", session=f"branch-{rep}", max_tokens=1)
                recompute = ask_greedy(engine, fork, "fork", use_cache=False, max_tokens=1)
                runs.append({"ram": _way(ram), "recompute": _way(recompute)})
            engine.flush_disk_cache()
        finally:
            engine.shutdown()
        load.append(os.getloadavg()[0])
        engine = _start(data, args)  # a restart: RAM empty, the disk cache as it was left
        try:
            for rep, fork in enumerate(forks):
                other = [*fork[:-1], ChatMessage("user", QUESTION_AFTER)]
                disk = ask_greedy(engine, other, "fork", session=f"branch-disk-{rep}", max_tokens=1)
                runs[rep]["disk"] = _way(disk)
        finally:
            engine.shutdown()
    load.append(os.getloadavg()[0])
    report = fork_report(args, runs, load)
    print(json.dumps(report, indent=2) if args.json else format_fork(report))
    return 0


def fork_report(args, runs: list[dict], load: list[float]) -> dict:
    def median(way: str, key: str) -> float:
        return statistics.median(run[way][key] for run in runs)

    return {
        "model": args.model,
        "machine": machine(),
        "load_1min": [round(x, 2) for x in load],  # before, at the restart, after
        "repeats": args.repeats,
        "turns": args.turns,
        "runs": runs,
        "median": {
            way: {
                key: median(way, key)
                for key in ("ttft_s", "prompt_tokens", "cached_tokens", "restored_tokens")
            }
            for way in ("ram", "disk", "recompute")
        },
        "recompute_over_ram": statistics.median(
            run["recompute"]["ttft_s"] / run["ram"]["ttft_s"] for run in runs
        ),
        "recompute_over_disk": statistics.median(
            run["recompute"]["ttft_s"] / run["disk"]["ttft_s"] for run in runs
        ),
    }


def format_fork(report: dict) -> str:
    median = report["median"]
    lines = [
        f"bench fork: {report['model']}, a branch of a {report['turns']}-turn chat "
        f"({median['ram']['prompt_tokens']:.0f} prompt tokens), medians of "
        f"{report['repeats']} (load {report['load_1min']})",
        "| the branch's first reply | TTFT | from the cache | recompute / this |",
        "| --- | --- | --- | --- |",
        f"| RAM (the history in the prefix cache) | {median['ram']['ttft_s']:.3f} s | "
        f"{median['ram']['cached_tokens']:.0f} tokens | {report['recompute_over_ram']:.1f}x |",
        f"| disk (after a restart) | {median['disk']['ttft_s']:.3f} s | "
        f"{median['disk']['restored_tokens']:.0f} tokens | {report['recompute_over_disk']:.1f}x |",
        f"| recompute (cache off) | {median['recompute']['ttft_s']:.3f} s | 0 tokens | 1.0x |",
    ]
    return "\n".join(lines)
