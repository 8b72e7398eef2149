"""``radixchat bench speculative``: decode speed with speculation (drafts from the prompt and
the radix tree, ``core.engine.drafts``) against ours without it and against
``mlx_lm.server``, on the same weights, greedy.

Four cases, each a request (or four) streamed from each server:

- ``rewrite``: a ~400-line Python module given in the prompt, to be written out again with
  one function renamed (``/v1/completions``, the reply started as a code block with the
  file's first three lines, so that a small model really copies);
- ``json``: a JSON document given on one line, written out again indented;
- ``chat``: the last turn of a multi-turn chat whose reply repeats nothing (the worst
  case: speculation only costs there);
- ``four``: four JSON requests (each its own document) sent together: their aggregate
  throughput, all tokens over the span from the first first token to the last token.

The servers are ``mlx_lm.server`` on the model saved as an MLX folder
(:func:`bench.agent.save_mlx_folder`) and one ``radixchat serve`` process, asked
per request with speculation on, then off (``radixchat.speculative``), in a cache namespace
of the repetition's own (a ``cache_salt``), its prompts computed first by a request for one
token: both start from a cached prompt, and no draft comes from an earlier reply to the
same prompt (the speculating request goes first). A request's decode speed is its
completion tokens after the first over the time from its first streamed token to its
last. Within a case the servers take turns request by request (which goes first alternates
between repetitions); the cases run one after the other, each row printed as its case
ends. The report gives medians over repetitions, the
ratios of the medians against the issue's targets, the acceptance (draft tokens taken over
those proposed) and whether the greedy texts came out identical.
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass

from bench.harness import announce_repetition, event_stream
from bench.server_process import (
    ServerProcess,
)
from bench.side_by_side import mlx_folder_and_data, ours_and_mlx_lm
from core import paths
from core.errors import UserError

CASES = ("rewrite", "json", "chat", "four")
WAYS = ("mlx_lm", "off", "on")  # mlx_lm.server; ours without and with speculation
POOL_TOKENS = 65536
# (case, ratio, against): the issue's targets for decode tok/s
TARGETS = (
    ("rewrite", 2.0, "mlx_lm"),
    ("rewrite", 1.8, "off"),
    ("json", 2.0, "mlx_lm"),
    ("json", 1.8, "off"),
    ("chat", 0.97, "off"),
    ("four", 1.5, "off"),
)
NAMES = (
    "record",
    "quantity",
    "price",
    "supplier",
    "location",
    "category",
    "batch",
    "order",
    "region",
)


@dataclass(frozen=True)
class Reply:
    """One streamed reply: its text, tokens, when its first and last tokens came, and (ours)
    the draft tokens proposed and accepted."""

    text: str
    tokens: int
    first_s: float
    last_s: float
    drafted: int = 0
    accepted: int = 0

    @property
    def decode_tps(self) -> float:
        span = self.last_s - self.first_s
        return (self.tokens - 1) / span if span > 0 and self.tokens > 1 else 0.0


# ------------------------------------------------------------------ the requests
def source_file() -> str:
    """A Python module of about 400 lines (an inventory of records), the same every run."""
    lines = ['"""Inventory records: loading, checking, pricing and reports."""', ""]
    lines += ["from __future__ import annotations", "", "import json", "import math", ""]
    for i, name in enumerate(NAMES):
        lines += [
            "",
            f"def load_{name}(path: str) -> list[dict]:",
            f'    """Read every {name} entry of the file at ``path``."""',
            "    with open(path, encoding='utf-8') as handle:",
            "        entries = json.load(handle)",
            f"    return [entry for entry in entries if entry.get('kind') == '{name}']",
            "",
            "",
            f"def check_{name}(entry: dict) -> list[str]:",
            f'    """What is wrong with one {name} entry (nothing: an empty list)."""',
            "    problems = []",
            "    if 'id' not in entry:",
            f"        problems.append('{name} without an id')",
            f"    if entry.get('count', 0) < {i}:",
            f"        problems.append('{name} count below {i}')",
            "    if not isinstance(entry.get('label'), str):",
            "        problems.append('label is not text')",
            "    return problems",
            "",
            "",
            f"def price_{name}(entry: dict, rate: float = {1 + i / 10:.1f}) -> float:",
            f'    """The value of one {name} entry at ``rate``, rounded to cents."""',
            "    base = entry.get('count', 0) * entry.get('unit_price', 0.0)",
            f"    discount = math.log1p(entry.get('count', 0)) / {10 + i}",
            "    return round(base * rate * (1 - discount), 2)",
            "",
            "",
            f"def report_{name}(entries: list[dict]) -> str:",
            f'    """One line per {name} entry: its id, count and price."""',
            "    rows = []",
            "    for entry in entries:",
            f"        value = price_{name}(entry)",
            "        label = entry.get('id', '?')",
            "        rows.append(f\"{label:>8} {entry.get('count', 0):>6} {value:>10.2f}\")",
            "    return '\\n'.join(rows)",
            "",
            "",
            f"def summarize_{name}(path: str) -> dict:",
            f'    """Counts of good and bad {name} entries in the file at ``path``."""',
            f"    entries = load_{name}(path)",
            f"    bad = [entry for entry in entries if check_{name}(entry)]",
            "    return {'total': len(entries), 'bad': len(bad), 'good': len(entries) - len(bad)}",
        ]
    return "\n".join(lines) + "\n"


def rewrite_prompt(index: int = 0) -> str:
    """The file, the request, and the copy's first three lines: a 135M model asked to write
    the file again without them writes a file of its own."""
    name = NAMES[index % len(NAMES)]
    start = "".join(source_file().splitlines(keepends=True)[:3])
    return (
        "Below is the file inventory.py.\n\n```python\n"
        + source_file()
        + f"```\n\nHere is inventory.py again, complete and unchanged except that the function "
        f"price_{name} is renamed to value_of_{name} (its uses too):\n\n```python\n" + start
    )


def json_document(variant: int = 0) -> dict:
    return {
        "inventory": [
            {
                "id": f"{name[:3].upper()}-{100 + i}",
                "kind": name,
                "count": 3 * i + 2 + variant,
                "unit_price": round(1.25 + i * 0.75, 2),
                "label": f"{name} shelf {i}",
                "tags": [name, "stock", f"aisle-{i % 3}"],
                "active": i % 2 == 0,
            }
            for i, name in enumerate(NAMES)
        ],
        "warehouse": {"city": CITIES[variant % len(CITIES)], "code": f"W-{variant}", "open": True},
    }


CITIES = ("Lyon", "Porto", "Gdansk", "Turin")


def json_prompt(variant: int = 0) -> str:
    return (
        "Reformat this JSON document, one field per line, indented by two spaces.\n\n"
        "Input:\n```json\n"
        + json.dumps(json_document(variant), separators=(",", ":"))
        + "\n```\n\nOutput:\n```json\n"
    )


CHAT = (
    ("user", "I am planning a trip to the mountains in autumn. What should I pack?"),
    (
        "assistant",
        "Warm layers, a waterproof jacket, sturdy boots, a hat and gloves, a map, a first "
        "aid kit, snacks and a water bottle.",
    ),
    ("user", "Which activities are good there in that season?"),
    (
        "assistant",
        "Hiking among the autumn colours, photography at sunrise, visiting local markets "
        "and tasting the harvest food.",
    ),
    ("user", "Write a short original poem about the first snow on a quiet lake."),
)


def chat_messages() -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in CHAT]


# ------------------------------------------------------------------ a request
def stream(
    host: str,
    port: int,
    path: str,
    body: dict,
    start: threading.Barrier | None = None,
) -> Reply:
    """One greedy streaming request to ``path``: the reply's text and timings."""
    conn = http.client.HTTPConnection(host, port, timeout=1200)
    try:
        conn.connect()
        if start is not None:
            start.wait()
        pieces: list[str] = []
        stamps: list[float] = []
        usage = None
        for now, chunk in event_stream(conn, path, json.dumps(body), "speculative"):
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", ()):
                text = choice.get("text") or (choice.get("delta") or {}).get("content")
                if text:
                    pieces.append(text)
                    stamps.append(now)
    finally:
        conn.close()
    if usage is None or not stamps:
        raise UserError("bench speculative: a stream ended without its text or usage")
    extra = usage.get("radixchat") or {}
    return Reply(
        "".join(pieces),
        usage["completion_tokens"],
        stamps[0],
        stamps[-1],
        extra.get("draft_tokens", 0),
        extra.get("accepted_tokens", 0),
    )


def request_of(case: str, way: str, index: int, salt: str, max_tokens: int) -> tuple[str, dict]:
    """The endpoint and body of request ``index`` of ``case`` for ``way``."""
    body: dict = {
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if way != "mlx_lm":
        body["cache_salt"] = salt
        body["radixchat"] = {"speculative": "off" if way == "off" else "ngram"}
    if case == "chat":
        return "/v1/chat/completions", {**body, "messages": chat_messages()}
    prompt = rewrite_prompt() if case == "rewrite" else json_prompt(index)
    return "/v1/completions", {**body, "prompt": prompt}


def run_case(server: ServerProcess, case: str, way: str, salt: str, max_tokens: int):
    """``case`` once on ``server``: its replies (four for ``four``)."""
    count = 4 if case == "four" else 1
    start = threading.Barrier(count) if count > 1 else None
    replies: list[Reply | None] = [None] * count
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            path, body = request_of(case, way, i, salt, max_tokens)
            replies[i] = stream(server.host, server.port, path, body, start)
        except BaseException as exc:  # re-raised on the bench's thread
            errors.append(exc)
            if start is not None:
                start.abort()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return replies


def throughput(replies: list[Reply]) -> float:
    """Decode tok/s of one request, or the aggregate of several sent together."""
    if len(replies) == 1:
        return replies[0].decode_tps
    span = max(r.last_s for r in replies) - min(r.first_s for r in replies)
    return sum(r.tokens - 1 for r in replies) / span if span > 0 else 0.0


# ------------------------------------------------------------------ the bench
def run_bench_speculative(args) -> int:
    cases = args.cases or list(CASES)
    root = paths.data_dir(args.data_dir)
    runs: dict[str, dict[str, list[list[Reply]]]] = {c: {w: [] for w in WAYS} for c in cases}
    with (
        mlx_folder_and_data(root, args.model, "speculative") as (mlx_folder, data),
        ours_and_mlx_lm(args.model, data, mlx_folder, POOL_TOKENS) as (ours, theirs),
    ):
        servers = {"mlx_lm": theirs, "off": ours, "on": ours}
        for way in ("mlx_lm", "off"):  # what loads lazily, loaded
            run_case(servers[way], "chat", way, "warm-up", 4)
        for case in cases:  # a case's repetitions, then the next case (its row printed)
            for rep in range(args.repeats):
                order = ("mlx_lm", "on", "off") if rep % 2 == 0 else ("on", "off", "mlx_lm")
                salt = f"bench-{time.time_ns()}-{case}"  # the repetition's namespace
                run_case(ours, case, "off", salt, 1)  # its prompts cached: on and off alike
                for way in order:
                    announce_repetition("speculative", rep, args.repeats, f"{case}, {way}")
                    runs[case][way].append(run_case(servers[way], case, way, salt, args.max_tokens))
            done = speculative_report(args, {case: runs[case]})
            print(format_report(done).splitlines()[2], file=sys.stderr, flush=True)
    report = speculative_report(args, runs)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def speculative_report(args, runs: dict[str, dict[str, list[list[Reply]]]]) -> dict:
    cases = {}
    for case, by_way in runs.items():
        tps = {way: statistics.median(throughput(r) for r in by_way[way]) for way in WAYS}
        on = [reply for replies in by_way["on"] for reply in replies]
        drafted = sum(r.drafted for r in on)
        accepted = sum(r.accepted for r in on)
        tokens = sum(r.tokens for r in on)
        texts = {way: [[r.text for r in replies] for replies in by_way[way]] for way in WAYS}
        cases[case] = {
            "decode_tps": tps,
            "on_vs_off": tps["on"] / tps["off"] if tps["off"] else None,
            "on_vs_mlx_lm": tps["on"] / tps["mlx_lm"] if tps["mlx_lm"] else None,
            "acceptance": accepted / drafted if drafted else None,
            "tokens_per_step": tokens / (tokens - accepted) if tokens > accepted else None,
            "completion_tokens": statistics.median(
                sum(r.tokens for r in replies) for replies in by_way["on"]
            ),
            "on_identical_to_off": texts["on"] == texts["off"],
            "identical_to_mlx_lm": texts["on"] == texts["mlx_lm"],
        }
    targets = [
        {
            "case": case,
            "vs": against,
            "target": ratio,
            "measured": cases[case]["on_vs_" + against],
            "met": (cases[case]["on_vs_" + against] or 0) >= ratio,
        }
        for case, ratio, against in TARGETS
        if case in cases
    ]
    return {
        "bench": "speculative",
        "model": args.model,
        "repeats": args.repeats,
        "max_tokens": args.max_tokens,
        "method": "greedy streaming requests, one radixchat serve (speculation off/on per "
        "request, a cache salt each) and mlx_lm.server on the same weights, interleaved; "
        "decode tok/s = (tokens - 1) / (last token - first token), four: aggregate; medians",
        "cases": cases,
        "targets": targets,
    }


def format_report(report: dict) -> str:
    lines = [
        f"bench speculative: {report['model']}, {report['repeats']} repetitions, "
        f"up to {report['max_tokens']} tokens a reply (decode tok/s, medians)",
        f"{'case':<9}{'mlx_lm':>9}{'off':>9}{'on':>9}{'on/off':>8}{'on/mlx':>8}"
        f"{'accept':>8}{'tok/step':>9}  identical (off, mlx_lm)",
    ]
    for case, c in report["cases"].items():
        tps = c["decode_tps"]
        acceptance = f"{c['acceptance']:.2f}" if c["acceptance"] is not None else "-"
        per_step = f"{c['tokens_per_step']:.2f}" if c["tokens_per_step"] is not None else "-"
        lines.append(
            f"{case:<9}{tps['mlx_lm']:>9.1f}{tps['off']:>9.1f}{tps['on']:>9.1f}"
            f"{c['on_vs_off']:>8.2f}{c['on_vs_mlx_lm']:>8.2f}{acceptance:>8}{per_step:>9}  "
            f"{'yes' if c['on_identical_to_off'] else 'NO'}, "
            f"{'yes' if c['identical_to_mlx_lm'] else 'no'}"
        )
    for t in report["targets"]:
        lines.append(
            f"target {t['case']} on/{t['vs']} >= {t['target']}: {t['measured']:.2f} "
            f"({'met' if t['met'] else 'NOT met'})"
        )
    return "\n".join(lines)
