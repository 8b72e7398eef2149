"""``radixchat bench multiturn``: one greedy N-turn chat, four ways, on the same weights.

1. ``ours_cached``: the engine with its radix prefix cache (session "bench");
2. ``ours_uncached``: the same engine, requests with ``use_cache=False``;
3. ``mlx_lm_cache``: mlx-lm's ``stream_generate`` with one prompt cache reused across
   turns, as ``mlx_lm.server`` reuses a cached prompt: the cache holds the previous prompt
   and reply; keep the common prefix with the new prompt (never all of it: at least one
   token is computed), ``trim_prompt_cache`` the rest, and pass only the new tokens;
4. ``mlx_lm_no_cache``: ``stream_generate`` from a fresh cache every turn.

Way 1 of the first repetition fixes the conversation: its replies are the assistant turns
of the history every way sees, so all four get identical prompts. Every reply of every way
is compared with that reference; a difference is reported, never hidden. Figures are
measured as ``core.engine.generation`` does: TTFT from the request's start (chat template
rendered, cache matched) to the first token; decode tokens/s = (completion tokens - 1) /
(last token time - first token time). Each repetition uses a fresh engine and fresh
mlx-lm caches; medians over repetitions are reported per turn.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass

import mlx.core as mx
import mlx_lm
from mlx_lm.generate import stream_generate
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
from mlx_lm.sample_utils import make_sampler

from bench.harness import final_event, repetitions
from core import paths
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.prompt import render_prompt
from core.engine.types import ChatMessage, GenerationRequest, SamplingParams
from core.errors import UserError

SYSTEM_PROMPT = "You are a helpful travel assistant. Answer briefly."
USER_MESSAGES = (
    "Hi! I'm planning a week-long trip to Japan in April. Where should I start?",
    "I like food and history more than nightlife. Tokyo or Kyoto first?",
    "What are three things I shouldn't miss in Kyoto?",
    "How do I get from Tokyo to Kyoto, and how long does it take?",
    "What is a reasonable daily budget for food and transport?",
    "Any day trips from Kyoto you would recommend?",
    "What should I pack for the weather in April?",
    "Can you sum up the plan as a day-by-day itinerary?",
    "Which Japanese phrases would be useful to learn?",
    "Do I need to book temples or restaurants in advance?",
    "Is the Japan Rail Pass worth it for this trip?",
    "Thanks! Any last tips before I book the flights?",
)
WAYS = ("ours_cached", "ours_uncached", "mlx_lm_cache", "mlx_lm_no_cache")
LABELS = ("ours+cache", "ours-cache", "mlx+reuse", "mlx-reuse")


@dataclass(frozen=True)
class TurnResult:
    reply: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    decode_tps: float


def _engine_turn(
    engine: Engine, messages: tuple[ChatMessage, ...], max_tokens: int, use_cache: bool
) -> TurnResult:
    request = GenerationRequest(
        messages=messages,
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
        session="bench" if use_cache else None,
        use_cache=use_cache,
    )
    last = final_event(engine.stream(request), "multiturn")
    s = last.stats
    return TurnResult(
        last.text, s.prompt_tokens, s.cached_tokens, s.completion_tokens, s.ttft_s, s.decode_tps
    )


class MlxLmChat:
    """Plain mlx-lm ``stream_generate``; with ``reuse``, one prompt cache kept across turns."""

    def __init__(self, loaded, reuse: bool):
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.context = loaded.info.context_length
        self.reuse = reuse
        self.sampler = make_sampler(temp=0.0)
        self.cache: list | None = None
        self.tokens: list[int] = []  # what self.cache holds: previous prompt + reply

    def turn(self, messages: tuple[ChatMessage, ...], max_tokens: int) -> TurnResult:
        started = time.perf_counter()
        prompt = render_prompt(self.tokenizer, GenerationRequest(messages=messages))
        if len(prompt) >= self.context:
            raise UserError(
                f"bench multiturn: the prompt ({len(prompt)} tokens) outgrew the "
                f"context ({self.context}); use fewer --turns or --max-tokens"
            )
        cache, keep = None, 0
        if self.reuse and self.cache is not None:
            keep = min(len(prompt) - 1, _common_prefix(self.tokens, prompt))
            if keep == len(self.tokens) or can_trim_prompt_cache(self.cache):
                trim_prompt_cache(self.cache, len(self.tokens) - keep)
                cache = self.cache
        if cache is None:
            cache, keep = make_prompt_cache(self.model), 0
        generated, text, stamps = [], [], []
        for response in stream_generate(
            self.model,
            self.tokenizer,
            prompt[keep:],
            max_tokens=min(max_tokens, self.context - len(prompt)),
            sampler=self.sampler,
            prompt_cache=cache,
        ):
            stamps.append(time.perf_counter())
            generated.append(response.token)
            text.append(response.text)
        if self.reuse:  # every token handed out was also fed to the cache
            self.cache, self.tokens = cache, prompt + generated
        span = stamps[-1] - stamps[0]
        tps = (len(generated) - 1) / span if span > 0 and len(generated) > 1 else 0.0
        return TurnResult(
            "".join(text), len(prompt), keep, len(generated), stamps[0] - started, tps
        )


def _common_prefix(a, b) -> int:
    """Length of the common prefix of two sequences (token ids or strings)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run_bench_multiturn(args) -> int:
    for name, low in (("turns", 1), ("max_tokens", 1), ("repeats", 1)):
        if getattr(args, name) < low:
            raise UserError(f"--{name.replace('_', '-')} must be at least {low}")
    if args.turns > len(USER_MESSAGES):
        raise UserError(
            f"--turns can be at most {len(USER_MESSAGES)} (the scripted conversation's length)"
        )
    from core.cli.progress import print_progress
    from core.models.load.loader import load_model

    root = paths.data_dir(args.data_dir)
    loaded = load_model(args.model, root, "auto", print_progress)  # the mlx-lm ways' weights
    pool_tokens = 1024 * -(-max(4096, 2 * args.turns * (args.max_tokens + 128)) // 1024)
    MlxLmChat(loaded, reuse=False).turn((ChatMessage("user", "Hello"),), 4)  # warm-up
    history: list[ChatMessage] = [ChatMessage("system", SYSTEM_PROMPT)]
    runs = {way: [] for way in WAYS}  # way -> repetition -> turn -> TurnResult
    segment_bytes = None if args.segment_mb is None else int(args.segment_mb * 2**20)
    for rep in repetitions("multiturn", args.repeats):
        engine = Engine(
            root,
            args.model,
            weights_format="auto",
            config=EngineConfig(
                use_cache=True,
                page_size=args.page_size,
                pool_tokens=pool_tokens,
                pool_segment_bytes=segment_bytes,
            ),
        ).start()
        try:
            info = engine.wait_ready()
            if info.fingerprint != loaded.info.fingerprint:
                raise RuntimeError(
                    f"engine weights {info.fingerprint} != mlx-lm weights {loaded.info.fingerprint}"
                )
            engine_warmup = GenerationRequest(
                prompt_text="Hello",
                use_cache=False,
                sampling=SamplingParams(temperature=0.0, max_tokens=4),
            )
            list(engine.stream(engine_warmup))
            page_size = engine.stats().cache.page_size
            chats = (MlxLmChat(loaded, reuse=True), MlxLmChat(loaded, reuse=False))
            for way in WAYS:
                runs[way].append([])
            for turn in range(args.turns):
                if rep == 0:
                    history.append(ChatMessage("user", USER_MESSAGES[turn]))
                messages = tuple(history[: 2 + 2 * turn])
                for way, use_cache in (("ours_cached", True), ("ours_uncached", False)):
                    runs[way][rep].append(
                        _engine_turn(engine, messages, args.max_tokens, use_cache)
                    )
                for way, chat in zip(WAYS[2:], chats):
                    runs[way][rep].append(chat.turn(messages, args.max_tokens))
                if rep == 0:
                    history.append(ChatMessage("assistant", runs["ours_cached"][0][turn].reply))
        finally:
            engine.shutdown()
            del engine  # free its weights and pool before the next one loads
            gc.collect()
            mx.clear_cache()
    report = _report(args, loaded.info, runs, pool_tokens, page_size)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


def _report(args, info, runs, pool_tokens, page_size) -> dict:
    reference = [r.reply for r in runs["ours_cached"][0]]
    mismatches = [
        {
            "repeat": rep + 1,
            "turn": turn + 1,
            "way": way,
            "at_char": _common_prefix(ref, r.reply),
            "expected": ref,
            "got": r.reply,
        }
        for way in WAYS
        for rep, results in enumerate(runs[way])
        for turn, (ref, r) in enumerate(zip(reference, results))
        if r.reply != ref
    ]

    def median(way: str, field: str) -> list[float]:
        return [
            statistics.median(getattr(rep[t], field) for rep in runs[way])
            for t in range(args.turns)
        ]

    ttft = {way: median(way, "ttft_s") for way in WAYS}
    decode = {way: median(way, "decode_tps") for way in WAYS}
    pairs = [
        (a, b) for a, b in zip(decode["ours_cached"], decode["mlx_lm_no_cache"]) if a > 0 and b > 0
    ]
    return {
        "model": info.name,
        "spec": args.model,
        "fingerprint": info.fingerprint,
        "weights_format": info.weights_format,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "mlx_device": str(mx.default_device()),
            "mlx": mx.__version__,
            "mlx_lm": mlx_lm.__version__,
        },
        "turns": args.turns,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "pool_tokens": pool_tokens,
        "page_size": page_size,
        "ways": dict(
            zip(
                WAYS,
                (
                    "engine, radix cache",
                    "engine, use_cache=False",
                    "mlx-lm stream_generate, one prompt cache reused (mlx_lm.server style)",
                    "mlx-lm stream_generate, fresh cache each turn",
                ),
            )
        ),
        "replies_identical": not mismatches,
        "mismatches": mismatches,
        "reference_replies": reference,
        "prompt_tokens": median("ours_cached", "prompt_tokens"),
        "completion_tokens": median("ours_cached", "completion_tokens"),
        "cached_tokens": {
            "ours_cached": median("ours_cached", "cached_tokens"),
            "mlx_lm_cache": median("mlx_lm_cache", "cached_tokens"),
        },
        "ttft_s": ttft,
        "decode_tps": decode,
        "ttft_s_each_repeat": {w: [[r.ttft_s for r in rep] for rep in runs[w]] for w in WAYS},
        "decode_ratio_basis": "median over turns of the per-turn ratio of medians "
        "(ours_cached decode tok/s / mlx_lm_no_cache decode tok/s)",
        "ttft_ratio_vs_mlx_lm_no_cache": ttft["ours_cached"][-1] / ttft["mlx_lm_no_cache"][-1],
        "ttft_ratio_vs_recompute": ttft["ours_cached"][-1] / ttft["ours_uncached"][-1],
        "ttft_ratio_vs_mlx_lm_cache": ttft["ours_cached"][-1] / ttft["mlx_lm_cache"][-1],
        "decode_ratio_vs_mlx_lm": statistics.median(a / b for a, b in pairs) if pairs else None,
    }


def format_table(report: dict) -> str:
    m = report["machine"]
    lines = [
        (
            f"model: {report['model']} ({report['weights_format']} weights, fingerprint "
            f"{report['fingerprint'][:16]})"
        ),
        (
            f"machine: {m['platform']}, {m['cpu_count']} CPUs, mlx {m['mlx']} on "
            f"{m['mlx_device']}, mlx-lm {m['mlx_lm']}"
        ),
        (
            f"{report['turns']} turns, up to {report['max_tokens']} reply tokens, medians of "
            f"{report['repeats']} repetitions; KV pool {report['pool_tokens']} tokens, pages of "
            f"{report['page_size']}"
        ),
        "ways: "
        + "; ".join(f"{label} = {report['ways'][way]}" for label, way in zip(LABELS, WAYS)),
        "",
        (
            f"{'':>4}{'prompt':>7}{'reply':>7}{'cached':>7}{'cached':>7} "
            f"|{'TTFT (s)':^44}|{'decode (tok/s)':^44}"
        ),
        f"{'turn':>4}{'tokens':>7}{'tokens':>7}{'ours':>7}{'mlx':>7} |"
        + "".join(f"{lab:>11}" for lab in LABELS)
        + "|"
        + "".join(f"{lab:>11}" for lab in LABELS),
    ]
    for t in range(report["turns"]):
        lines.append(
            (
                f"{t + 1:>4}{report['prompt_tokens'][t]:>7.0f}"
                f"{report['completion_tokens'][t]:>7.0f}"
                f"{report['cached_tokens']['ours_cached'][t]:>7.0f}"
                f"{report['cached_tokens']['mlx_lm_cache'][t]:>7.0f} |"
            )
            + "".join(f"{report['ttft_s'][w][t]:>11.3f}" for w in WAYS)
            + "|"
            + "".join(f"{report['decode_tps'][w][t]:>11.1f}" for w in WAYS)
        )
    decode = report["decode_ratio_vs_mlx_lm"]
    lines += [
        "",
        (
            "last turn TTFT, ours+cache / ours-cache (recompute): "
            f"{report['ttft_ratio_vs_recompute']:.3f}"
        ),
        (
            "last turn TTFT, ours+cache / mlx-lm with reuse:      "
            f"{report['ttft_ratio_vs_mlx_lm_cache']:.3f}"
        ),
        (
            "last turn TTFT, ours+cache / mlx-lm without reuse:   "
            f"{report['ttft_ratio_vs_mlx_lm_no_cache']:.3f}"
        ),
        "decode tok/s, ours+cache / mlx-lm without reuse:     "
        + (f"{decode:.3f}" if decode is not None else "n/a")
        + " (median over turns of per-turn ratios)",
        "replies: identical in all four ways"
        if report["replies_identical"]
        else (
            f"replies: {len(report['mismatches'])} MISMATCH(ES) vs the reference (ours+cache, "
            "repetition 1):"
        ),
    ]
    lines += [
        f"  repetition {x['repeat']} turn {x['turn']} {x['way']}: differs at char {x['at_char']}: "
        f"expected {x['expected'][x['at_char'] :][:40]!r}, got {x['got'][x['at_char'] :][:40]!r}"
        for x in report["mismatches"]
    ]
    return "\n".join(lines)
