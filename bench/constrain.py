"""``radixchat bench constrain``: what constrained decoding (llguidance) costs per token.

On the engine directly (no HTTP), greedy, the prompt cache off so every request computes
the same work. Each repetition runs, one request at a time:

- ``free``: a plain chat reply;
- ``json_schema``: the same prompt, the reply constrained to a JSON schema;
- ``tool_required``: the same prompt with one tool and ``tool_choice`` "required" (a
  ``<tool_call>`` wrapper around JSON for the tool's parameters);

then four requests decoded together in one batch, first all free, then two free and two
constrained to the JSON schema, on the same prompts (each row its own processor or none). A
request's decode rate is its tokens after the first over the time from its first to its last
token (the engine's ``decode_tps``); a batch's is the tokens of all its rows over the batch's
wall time. The wall-clock cost per token is ``1/rate(constrained) - 1/rate(free)`` in
milliseconds; the CPU cost per token is the engine thread's CPU time inside the grammar
processor (matcher, mask) over the request's tokens (``RequestStats.constraint_cpu_s``), which a
busy machine disturbs far less than wall time. Medians over repetitions.
"""

from __future__ import annotations

import json
import statistics
import time

from bench.harness import final_event, repetitions
from core import paths
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ChatMessage, DoneEvent, GenerationRequest, SamplingParams
from core.errors import UserError
from core.models.load.chat_template import read_chat_template

PROMPT = "Describe a fictional person: their name, age, city and three hobbies."
# Bounded, so a forced call always ends within CALL_TOKENS (a call cut by max_tokens is an
# error, with no figures: core.engine.replies.cut_call)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 16},
        "hobbies": {
            "type": "array",
            "items": {"type": "string", "maxLength": 16},
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}
# the longest call the bounded schema allows, one byte a token (the tiny models' tokenizer),
# with the generic format's markup around it
CALL_TOKENS = 384
TOOL = {
    "type": "function",
    "function": {"name": "save_person", "description": "Store a person", "parameters": SCHEMA},
}


def _request(mode: str, max_tokens: int, n: int = 0) -> GenerationRequest:
    extra = (
        {"json_schema": SCHEMA}
        if mode == "json_schema"
        else ({"tools": (TOOL,), "tool_choice": "required"} if mode == "tool_required" else {})
    )
    if mode == "tool_required":  # a forced call runs to its end
        max_tokens = max(max_tokens, CALL_TOKENS)
    return GenerationRequest(
        messages=(ChatMessage("user", f"{PROMPT} ({n})"),),
        use_cache=False,
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
        **extra,
    )


def _done(handle) -> DoneEvent:
    return final_event(handle.events(timeout=600), "constrain")


def _batch(
    engine: Engine, modes: list[str], max_tokens: int, n: int
) -> tuple[float, list[DoneEvent]]:
    """Tokens per second over the wall time of ``modes`` decoded together, and their ends."""
    started = time.perf_counter()
    handles = [engine.submit(_request(mode, max_tokens, n + i)) for i, mode in enumerate(modes)]
    dones = [_done(h) for h in handles]
    wall = time.perf_counter() - started
    return sum(d.stats.completion_tokens for d in dones) / wall, dones


def _cpu_ms(done: DoneEvent) -> float:
    return 1000 * done.stats.constraint_cpu_s / max(1, done.stats.completion_tokens)


def run_bench_constrain(args) -> int:
    if args.repeats < 1 or args.max_tokens < 8:
        raise UserError("--repeats must be at least 1 and --max-tokens at least 8")
    from core.cli.progress import print_progress

    template = (
        read_chat_template(args.chat_template) if getattr(args, "chat_template", None) else None
    )
    engine = Engine(
        paths.data_dir(args.data_dir),
        args.model,
        on_load_progress=print_progress,
        config=EngineConfig(disk_cache=False, pool_tokens=16384, chat_template=template),
    ).start()
    solo: dict[str, list[float]] = {"free": [], "json_schema": [], "tool_required": []}
    tokens: dict[str, list[int]] = {mode: [] for mode in solo}
    cpu_ms: dict[str, list[float]] = {
        "json_schema": [],
        "tool_required": [],
        "json_schema_batched": [],
    }
    batches: dict[str, list[float]] = {"4_free": [], "2_free_2_constrained": []}
    try:
        info = engine.wait_ready()
        _done(engine.submit(_request("json_schema", 8)))  # warm-up: builds llguidance's tokenizer
        for rep in repetitions("constrain", args.repeats):
            for mode in solo:
                done = _done(engine.submit(_request(mode, args.max_tokens, rep)))
                solo[mode].append(done.stats.decode_tps)
                tokens[mode].append(done.stats.completion_tokens)
                if mode in cpu_ms:
                    cpu_ms[mode].append(_cpu_ms(done))
            batches["4_free"].append(_batch(engine, ["free"] * 4, args.max_tokens, 10 * rep)[0])
            # the same prompts as the free batch: only the constraint differs
            rate, dones = _batch(
                engine, ["free", "json_schema", "free", "json_schema"], args.max_tokens, 10 * rep
            )
            batches["2_free_2_constrained"].append(rate)
            cpu_ms["json_schema_batched"] += [_cpu_ms(dones[1]), _cpu_ms(dones[3])]
    finally:
        engine.shutdown()
    rate = {mode: statistics.median(values) for mode, values in {**solo, **batches}.items()}

    def cost_ms(mode: str, base: str) -> float:
        return 1000 / rate[mode] - 1000 / rate[base]

    report = {
        "model": info.name,
        "library": "llguidance",
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "method": "greedy, prompt cache off; solo decode_tps per mode, batch tokens/wall; medians",
        "decode_tokens_per_s": rate,
        "completion_tokens_median": {m: statistics.median(t) for m, t in tokens.items()},
        "constraint_cpu_ms_per_token": {m: statistics.median(v) for m, v in cpu_ms.items()},
        "cost_ms_per_token": {
            "json_schema": cost_ms("json_schema", "free"),
            "tool_required": cost_ms("tool_required", "free"),
            "batch_2_of_4_constrained": cost_ms("2_free_2_constrained", "4_free"),
        },
        "runs": {**solo, **batches},
        "constraint_cpu_ms_runs": cpu_ms,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for mode, value in rate.items():
            print(f"{mode:>22}: {value:7.2f} tok/s")
        for mode, value in report["cost_ms_per_token"].items():
            print(f"wall-clock cost of {mode}: {value:+.2f} ms per token")
        for mode, value in report["constraint_cpu_ms_per_token"].items():
            print(f"grammar CPU time, {mode}: {value:.3f} ms per token")
    return 0
