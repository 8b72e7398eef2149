"""``radixchat bench restore --api``: an unnamed API client's long prompt after a restart.

Each repetition, in a fresh data folder under ``<data>/tmp``: server A (an engine and
:class:`core.api.server.ApiServer` on 127.0.0.1, any free port) gets one streaming chat
request of about N tokens (a system prompt of travel notes and a question, no session:
the client is an agent, not a chat window), and waits until its cache is written. Then
**ram**: the same prefix plus a new question, on A (a RAM hit). A shuts down; the
database leaves the page cache. Server B starts on the same folder (the restart), warms
up on an unrelated short request, then **restore**: the same follow-up (its prefix found
on disk by its tokens and read back). Server C starts with the disk cache off on the same
weights, warms up, then **recompute**: the same follow-up from scratch. TTFT is the
client's (request sent to first streamed token, over HTTP); the three greedy replies must
agree (reported, never hidden). Medians over repetitions; ratios are ratios of medians.
"""

from __future__ import annotations

import gc
import http.client
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.harness import (
    chat_stream,
    drop_from_page_cache,
    repetitions,
    scratch_data_folder,
    travel_notes,
)
from bench.restore import (
    BUILD_REPLY_TOKENS,
    FIRST_QUESTION,
    FOLLOW_UP,
    REPLY_TOKENS,
    checked_model,
)
from core import paths
from core.api.server import ApiServer
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.errors import UserError


@dataclass(frozen=True)
class ApiRepetition:
    prompt_tokens: int  # the first request's
    follow_up_tokens: int
    restored_tokens: int  # read back from disk by server B (its engine's figure)
    ttft_restore_s: float
    ttft_recompute_s: float
    ttft_ram_s: float
    replies_identical: bool
    bytes_written: int  # by server A's disk tier


@dataclass(frozen=True)
class _Reply:
    ttft_s: float
    text: str
    prompt_tokens: int


def _stream(server: ApiServer, messages: list[dict], max_tokens: int) -> _Reply:
    """One greedy streaming chat request; TTFT as the client sees it."""
    body = json.dumps(
        {
            "model": "default",
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    conn = http.client.HTTPConnection(server.host, server.port, timeout=600)
    try:
        conn.connect()
        sent = time.perf_counter()
        first, parts, usage = None, [], None
        for _, chunk in chat_stream(conn, body, "restore --api"):
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", ()):
                text = choice.get("delta", {}).get("content")
                if text or choice.get("finish_reason"):
                    first = first or time.perf_counter()
                parts.append(text or "")
    finally:
        conn.close()
    if first is None or usage is None:
        raise UserError("bench restore --api: a stream ended without tokens or usage")
    return _Reply(first - sent, "".join(parts), usage["prompt_tokens"])


def _messages(count: int, *turns: str) -> list[dict]:
    roles = ("user", "assistant")
    return [{"role": "system", "content": travel_notes(count)}] + [
        {"role": roles[i % 2], "content": text} for i, text in enumerate(turns)
    ]


def _repetition(folder: Path, spec: str, tokens: int) -> ApiRepetition:
    import mlx.core as mx

    pool = 1024 * -(-(tokens + 1024) // 1024)

    def serve(disk_cache: bool = True) -> tuple[Engine, ApiServer]:
        engine = Engine(
            folder, spec, config=EngineConfig(pool_tokens=pool, disk_cache=disk_cache)
        ).start()
        engine.wait_ready()
        return engine, ApiServer(engine, "127.0.0.1", 0).start()

    def close(engine: Engine, server: ApiServer) -> None:
        server.stop()
        engine.shutdown()
        gc.collect()
        mx.clear_cache()

    engine, server = serve()
    try:
        base = _stream(server, _messages(0, FIRST_QUESTION), 1).prompt_tokens  # also the warm-up
        # (short: tiny contexts too)
        one = _stream(server, _messages(1, FIRST_QUESTION), 1).prompt_tokens
        count = max(1, round((tokens - base) / max(1.0, one - base)))
        first = _stream(server, _messages(count, FIRST_QUESTION), BUILD_REPLY_TOKENS)
        engine.flush_disk_cache()
        follow_up = _messages(count, FIRST_QUESTION, first.text, FOLLOW_UP)
        ram = _stream(server, follow_up, REPLY_TOKENS)
        engine.flush_disk_cache()
        written = engine.stats().disk.bytes_written
    finally:
        close(engine, server)
    drop_from_page_cache(*paths.kv_cache_db_files(folder))
    engine, server = serve()  # "after a restart"
    try:
        # warm-up (too short to be written)
        _stream(server, [{"role": "user", "content": "Hello"}], 1)
        drop_from_page_cache(*paths.kv_cache_db_files(folder))
        restore = _stream(server, follow_up, REPLY_TOKENS)
        restored = engine.stats().disk.read_tokens
    finally:
        close(engine, server)
    engine, server = serve(disk_cache=False)
    try:
        _stream(server, [{"role": "user", "content": "Hello"}], 1)
        recompute = _stream(server, follow_up, REPLY_TOKENS)
    finally:
        close(engine, server)
    return ApiRepetition(
        first.prompt_tokens,
        restore.prompt_tokens,
        restored,
        restore.ttft_s,
        recompute.ttft_s,
        ram.ttft_s,
        ram.text == restore.text == recompute.text,
        written,
    )


def run_bench_restore_api(args) -> int:
    root, spec = checked_model(args)
    report = _report(args, spec, root)
    print(json.dumps(report, indent=2) if args.json else format_api_summary(report))
    return 0


def _report(args, spec: str, root: Path) -> dict:
    reps: list[ApiRepetition] = []
    started = time.perf_counter()
    for _ in repetitions("restore --api", args.repeats):
        with scratch_data_folder(root, "restore") as folder:
            reps.append(_repetition(folder, spec, args.tokens))
    ttft = {
        way: statistics.median(getattr(r, f"ttft_{way}_s") for r in reps)
        for way in ("restore", "recompute", "ram")
    }
    return {
        "mode": "api",
        "model": args.model,
        "model_path": spec,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "wall_s": round(time.perf_counter() - started, 1),
        "prompt_tokens": statistics.median(r.prompt_tokens for r in reps),
        "follow_up_tokens": statistics.median(r.follow_up_tokens for r in reps),
        "restored_tokens": statistics.median(r.restored_tokens for r in reps),
        "replies_identical": all(r.replies_identical for r in reps),
        "ttft_s": ttft,
        "ttft_ratio_restore_vs_recompute": ttft["restore"] / ttft["recompute"],
        "ttft_ratio_restore_vs_ram": ttft["restore"] / ttft["ram"],
        "repetitions": [asdict(r) for r in reps],
    }


def format_api_summary(report: dict) -> str:
    t = report["ttft_s"]
    return "\n".join(
        [
            f"model: {report['model']} ({report['model_path']}); API, unnamed client; medians of "
            f"{report['repeats']} repetitions ({report['wall_s']:.0f} s)",
            (
                f"first prompt {report['prompt_tokens']:.0f} tokens; after the restart the "
                f"follow-up ({report['follow_up_tokens']:.0f} tokens) got "
                f"{report['restored_tokens']:.0f} from disk"
            ),
            (
                f"TTFT (client side): restored {t['restore']:.3f} s, recomputed "
                f"{t['recompute']:.3f} s, RAM hit {t['ram']:.3f} s"
            ),
            (
                f"restore / recompute {report['ttft_ratio_restore_vs_recompute']:.3f} (target <= "
                f"0.05), restore / RAM {report['ttft_ratio_restore_vs_ram']:.3f} (target <= 1.5)"
            ),
            "replies: identical in all three ways"
            if report["replies_identical"]
            else "replies: DIFFER",
        ]
    )
