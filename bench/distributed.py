"""``radixchat bench distributed``: the same greedy chat on one process and split over 2 ranks.

Two servers run side by side on this machine: ``radixchat serve`` (one process) and
``radixchat serve --hosts`` with a loopback hostfile (2 ranks over MLX's ring backend, the
model split by tensor parallelism, or by layers with ``--split pipeline``). For each prompt
length and repetition, each server in turn gets a fresh prompt (uncached: the whole prompt
is computed) and then the same prompt again (cached: only its last token is), streamed
greedy replies of ``--max-tokens``. The
client measures time to first token and the decode rate (completion tokens after the
first, over the time from the first token to the last). Medians over repetitions.

On one machine the split model is slower (2 processes share the cores and every layer
adds two all-sums per token; a pipeline adds a send and an all-gather per token, but its
ranks work in turn): the figures show what the collectives cost per token and how that
grows with the prompt, not what two Macs gain. The default model is a generated llama
(random weights) whose heads divide by 2, or for ``--split pipeline`` a qwen2 of the same
shape (llama has no pipeline split); ``--model`` takes any model that splits.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import chat_stream
from bench.server_process import free_port, wait_until_answers
from core.errors import UserError

START_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 600.0
MODES = ("single", "split2")


def bench_model(folder: Path, kind: str = "llama") -> Path:
    """A generated model big enough that compute, not Python, shows (heads divide by 2):
    a llama, or a qwen2 (the same shape; it also pipelines)."""
    from core.models.tiny_model import TinyModelSpec, write_tiny_model

    spec = TinyModelSpec(
        kind=kind,
        hidden_size=512,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        intermediate_size=1536,
        max_position_embeddings=8192,
    )
    return write_tiny_model(folder / f"bench-{kind}", spec)


def _start(args: list[str], port: int, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "core.cli.main", "serve", "--port", str(port), *args]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    if wait_until_answers(process, port, "/health", START_TIMEOUT_S):
        return process
    if process.poll() is not None:
        raise UserError(
            f"bench distributed: a server exited ({process.returncode}): "
            f"{log.read_text(errors='replace').strip().splitlines()[-1:]}"
        )
    _stop(process)
    raise UserError(f"bench distributed: a server did not start within {START_TIMEOUT_S:.0f} s")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def ask(port: int, prompt: str, max_tokens: int) -> dict:
    """One streamed greedy chat request: TTFT, decode rate, tokens, cached tokens."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    sent = time.perf_counter()
    first = last = None
    usage = {}
    text = []
    try:
        for now, data in chat_stream(conn, json.dumps(body), "distributed"):
            usage = data.get("usage") or usage
            for choice in data.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    last = now
                    first = first or last
                    text.append(piece)
    finally:
        conn.close()
    tokens = usage.get("completion_tokens", 0)
    span = (last - first) if first is not None else 0.0
    return {
        "ttft_s": (first or time.perf_counter()) - sent,
        "decode_tps": (tokens - 1) / span if span > 0 and tokens > 1 else 0.0,
        "completion_tokens": tokens,
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        "text": "".join(text),
    }


def prompt_of(length: int, tag: str) -> str:
    """About ``length`` tokens of text (a byte tokenizer: one per character), unique by ``tag``."""
    words = f"{tag}: " + " ".join(f"note {i} on the ring" for i in range(length))
    return words[:length]


def run_bench_distributed(args) -> int:
    from core.distributed.launch import launcher_command

    launcher_command()  # fails in one line where MLX's launcher is missing
    lengths = sorted({int(n) for n in str(args.prompt_tokens).split(",") if n.strip()})
    with tempfile.TemporaryDirectory(prefix="radixchat-bench-dist-") as tmp:
        work = Path(tmp)
        split = getattr(args, "split", "tensor")
        model = (
            Path(args.model)
            if args.model
            else bench_model(work, "qwen2" if split == "pipeline" else "llama")
        )
        hosts = work / "hosts.json"
        hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
        ports = {mode: free_port() for mode in MODES}
        common = ["--model", str(model), "--kv-tokens", str(args.kv_tokens)]
        servers = {}
        try:
            servers["single"] = _start(
                [*common, "--data-dir", str(work / "single")], ports["single"], work / "single.log"
            )
            servers["split2"] = _start(
                [
                    *common,
                    "--data-dir",
                    str(work / "split"),
                    "--hosts",
                    str(hosts),
                    "--ring-port",
                    str(free_port(2)),
                    "--split",
                    split,
                ],
                ports["split2"],
                work / "split.log",
            )
            for mode in MODES:  # warm-up: first-call compilation and allocation
                ask(ports[mode], prompt_of(32, f"warm-up {mode}"), 4)
            runs = {mode: {n: {"uncached": [], "cached": []} for n in lengths} for mode in MODES}
            same = True
            for rep in range(args.repeats):
                for n in lengths:
                    texts = {}
                    # interleaved, order alternating
                    for mode in MODES if rep % 2 == 0 else MODES[::-1]:
                        prompt = prompt_of(n, f"repetition {rep} length {n}")
                        runs[mode][n]["uncached"].append(ask(ports[mode], prompt, args.max_tokens))
                        runs[mode][n]["cached"].append(ask(ports[mode], prompt, args.max_tokens))
                        texts[mode] = runs[mode][n]["uncached"][-1]["text"]
                    same = same and texts["single"] == texts["split2"]
        finally:
            for server in servers.values():
                _stop(server)
    report = _report(args, model, lengths, runs, same)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


def _report(args, model: Path, lengths, runs, same: bool) -> dict:
    def median(results, key):
        return statistics.median(r[key] for r in results)

    rows = []
    for n in lengths:
        for cache in ("uncached", "cached"):
            row = {
                "prompt_tokens": median(runs["single"][n][cache], "prompt_tokens"),
                "cache": cache,
            }
            for mode in MODES:
                results = runs[mode][n][cache]
                row[f"{mode}_ttft_s"] = median(results, "ttft_s")
                row[f"{mode}_decode_tps"] = median(results, "decode_tps")
                row[f"{mode}_cached_tokens"] = median(results, "cached_tokens")
            single, split = row["single_decode_tps"], row["split2_decode_tps"]
            row["collective_ms_per_token"] = (
                1000 * (1 / split - 1 / single) if single and split else None
            )
            rows.append(row)
    return {
        "model": str(model),
        "repeats": args.repeats,
        "max_tokens": args.max_tokens,
        "ranks": 2,
        "split": getattr(args, "split", "tensor"),
        "transport": "loopback (127.0.0.1), MLX ring backend",
        "cpus": os.cpu_count(),
        "same_greedy_replies": same,
        "rows": rows,
    }


def format_table(report: dict) -> str:
    lines = [
        (
            f"bench distributed: {Path(report['model']).name}, 1 process vs 2 ranks "
            f"({report['split']} split) on {report['transport']}, medians of "
            f"{report['repeats']}, {report['max_tokens']} tokens a reply"
        ),
        (
            f"{'prompt':>7} {'cache':>9} {'TTFT 1 proc':>12} {'TTFT 2 ranks':>13} "
            f"{'decode 1 proc':>14} {'decode 2 ranks':>15} {'+ms/token':>10}"
        ),
    ]
    for row in report["rows"]:
        extra = row["collective_ms_per_token"]
        lines.append(
            f"{row['prompt_tokens']:>7.0f} {row['cache']:>9} "
            f"{row['single_ttft_s'] * 1000:>10.1f}ms {row['split2_ttft_s'] * 1000:>11.1f}ms "
            f"{row['single_decode_tps']:>10.1f} t/s {row['split2_decode_tps']:>11.1f} t/s "
            f"{extra if extra is None else f'{extra:.2f}':>10}"
        )
    lines.append(
        f"greedy replies the same split and not: {'yes' if report['same_greedy_replies'] else 'NO'}"
    )
    return "\n".join(lines)
