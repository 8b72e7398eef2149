"""``radixchat bench agent``: a coding-agent session replayed three ways, time to first
token summed over every request.

The trace (``core.cli.bench.agent_trace``): two agents on one ~2,000-token system prompt
with tool definitions, ten rounds of tool call and result each (outputs of 100-300
tokens), one turn with a stop sequence each, interleaved. Every request streams a greedy
reply of ``--max-tokens`` tokens. The three ways:

1. ``ours_cache``: :class:`core.api.server.ApiServer` in-process over an engine with its
   prefix cache (a fresh data folder, so nothing is cached before the first request);
2. ``ours_no_cache``: the same with the cache off (every prompt computed whole);
3. ``mlx_lm_server``: ``mlx_lm.server`` as a subprocess (its prompt cache on, the
   default), on the same weights saved as an MLX folder (it reads no GGUF), with the
   same chat template, started after ``import core`` so its CPU backend is set up the
   way ours is; through its OpenAI API with the same messages.

Our server is driven through ``/v1/messages`` (Anthropic) when that route takes tools,
else through ``/v1/chat/completions`` (the report says which). A request's TTFT is the time
from sending it to the first streamed piece of the reply (text, or a tool call), on the
client. Before each way, one unrelated warm-up request loads what loads lazily.
``--json`` ends with ``ttft_sum_s`` for each way and the ratios; ``replies_identical``
says whether every reply came out the same with and without our cache.
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from core import paths
from core.cli.bench.agent_trace import Trace, anthropic_body, build_trace, openai_body
from core.errors import UserError
from core.models.chat_template import read_chat_template

WAYS = ("ours_cache", "ours_no_cache", "mlx_lm_server")
POOL_TOKENS = 65536
START_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 900


@dataclass(frozen=True)
class Reply:
    """One streamed request as the client saw it."""

    ttft_s: float
    total_s: float
    text: str  # the reply's text, then its tool calls as JSON


# ------------------------------------------------------------------ the client
def _sse_events(response):
    """(event name, data) pairs of a server-sent event stream."""
    event = None
    while True:
        line = response.readline()
        if not line:
            return
        line = line.decode("utf-8").rstrip("\r\n")
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield event, json.loads(data)
            event = None


def stream(host: str, port: int, path: str, body: dict, headers: dict | None = None) -> Reply:
    """Send one streaming request (OpenAI or Anthropic, by ``path``) and time its reply."""
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
    sent = time.perf_counter()
    first = None
    text, calls = [], {}
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        if response.status != 200:
            raise UserError(f"bench agent: {path} answered {response.status}: {response.read()[:300]!r}")
        for event, data in _sse_events(response):
            piece = _piece(path, event, data, text, calls)
            if piece and first is None:
                first = time.perf_counter()
            if event == "message_stop":
                break
    finally:
        conn.close()
    ended = time.perf_counter()
    return Reply((first or ended) - sent, ended - sent,
                 "".join(text) + "".join(json.dumps(c, sort_keys=True) for c in calls.values()))


def _piece(path: str, event: str | None, data: dict, text: list, calls: dict) -> bool:
    """Record what ``data`` brings of the reply; True if it brings any."""
    if path.endswith("/messages"):  # Anthropic events
        kind = data.get("type", event)
        if kind == "content_block_start" and data["content_block"].get("type") == "tool_use":
            block = data["content_block"]
            calls[data["index"]] = {"name": block["name"], "input": ""}
            return True
        if kind == "content_block_delta":
            delta = data["delta"]
            if delta.get("type") == "text_delta" and delta.get("text"):
                text.append(delta["text"])
                return True
            if delta.get("type") == "input_json_delta":
                calls[data["index"]]["input"] += delta.get("partial_json", "")
                return True
        return False
    choices = data.get("choices") or []
    if not choices:
        return False
    delta = choices[0].get("delta") or {}
    got = False
    if delta.get("content"):
        text.append(delta["content"])
        got = True
    for call in delta.get("tool_calls") or []:
        entry = calls.setdefault(call.get("index", len(calls)), {"name": "", "input": ""})
        function = call.get("function") or {}
        entry["name"] += function.get("name") or ""
        entry["input"] += function.get("arguments") or ""
        got = True
    return got


# ------------------------------------------------------------------ the servers
def _messages_take_tools(host: str, port: int, trace: Trace) -> bool:
    """Whether the server's ``/v1/messages`` exists and takes tools (a one-token probe)."""
    body = {"model": "claude-sonnet-4-5", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}],
            "tools": [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                      for t in trace.tools[:1]]}
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", "/v1/messages", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _replay(host: str, port: int, trace: Trace, max_tokens: int, anthropic: bool, label: str) -> list[Reply]:
    path = "/v1/messages" if anthropic else "/v1/chat/completions"
    warm = {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 4, "temperature": 0,
            "stream": True}
    if anthropic:
        warm["model"] = "claude-sonnet-4-5"
    stream(host, port, path, warm)
    replies = []
    for i, request in enumerate(trace.requests):
        body = (anthropic_body if anthropic else openai_body)(trace, request, max_tokens)
        replies.append(stream(host, port, path, body))
        print(f"radixchat: bench agent: {label}: request {i + 1}/{len(trace.requests)}, "
              f"TTFT {replies[-1].ttft_s:.2f} s", file=sys.stderr, flush=True)
    return replies


def run_ours(root: Path, model: str, use_cache: bool, trace: Trace, max_tokens: int,
             template: str | None = None) -> tuple[list[Reply], bool]:
    """The trace through our API server (in-process) over a fresh engine."""
    from core.api.server import ApiServer
    from core.engine.engine import Engine

    with tempfile.TemporaryDirectory(prefix="radixchat-bench-agent-") as folder:
        data = Path(folder)
        _link_models(root, data)
        engine = Engine(data, model, use_cache=use_cache, pool_tokens=POOL_TOKENS, chat_template=template).start()
        server = None
        try:
            engine.wait_ready()
            server = ApiServer(engine, "127.0.0.1", 0).start()
            anthropic = _messages_take_tools(server.host, server.port, trace)
            label = "ours_cache" if use_cache else "ours_no_cache"
            return _replay(server.host, server.port, trace, max_tokens, anthropic, label), anthropic
        finally:
            if server is not None:
                server.stop()
            engine.shutdown()


def _link_models(root: Path, data: Path) -> None:
    """The models of data folder ``root`` in a fresh one, ``data`` (its caches start empty)."""
    source = paths.models_dir(root)
    target = paths.models_dir(data)
    for item in source.iterdir() if source.exists() else ():
        if not (target / item.name).exists():
            (target / item.name).symlink_to(item)


def save_mlx_folder(root: Path, model: str, folder: Path, template: str | None = None) -> None:
    """Load ``model`` the way the engine does and save it as an MLX model folder that
    ``mlx_lm.load`` reads: the same (quantized) weights, config and tokenizer, the chat
    template included."""
    import mlx.nn as nn
    from mlx_lm.utils import save_config, save_model

    from core.models.loader import load_model

    loaded = load_model(model, root, chat_template=template)
    config = dict(loaded.config)
    quantized = {name: {"group_size": m.group_size, "bits": m.bits, "mode": getattr(m, "mode", "affine")}
                 for name, m in loaded.model.named_modules()
                 if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
    if quantized:
        first = next(iter(quantized.values()))
        config["quantization"] = {**first, **quantized}
    config["eos_token_id"] = sorted(loaded.tokenizer.eos_token_ids)
    save_model(folder, loaded.model)
    save_config(config, folder / "config.json")
    loaded.tokenizer.save_pretrained(str(folder))


def run_mlx_lm_server(folder: Path, trace: Trace, max_tokens: int) -> list[Reply]:
    """The trace through ``mlx_lm.server`` (a subprocess, its prompt cache on)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = ("import core, sys; from mlx_lm.server import main; "
            f"sys.argv = ['mlx_lm.server', '--model', {str(folder)!r}, '--host', '127.0.0.1', "
            f"'--port', '{port}', '--log-level', 'WARNING']; main()")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[3]),
                                                          os.environ.get("PYTHONPATH", "")])}
    log = tempfile.TemporaryFile()
    process = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, process, log)
        return _replay("127.0.0.1", port, trace, max_tokens, False, "mlx_lm_server")
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def _wait_for_port(port: int, process, log) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise UserError(f"mlx_lm.server exited with {process.returncode}: "
                            f"{log.read().decode(errors='replace').strip().splitlines()[-1:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/v1/models")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.5)
        finally:
            conn.close()
    raise UserError(f"mlx_lm.server did not answer within {START_TIMEOUT_S} s")


# ------------------------------------------------------------------ the bench
def run_bench_agent(args) -> int:
    if args.max_tokens < 1 or args.repeats < 1:
        raise UserError("--max-tokens and --repeats must be at least 1")
    if args.rounds < 1:
        raise UserError("--rounds must be at least 1")
    template = read_chat_template(args.chat_template) if args.chat_template else None
    trace = build_trace(args.rounds)
    root = paths.data_dir(args.data_dir)
    runs: dict[str, list[list[Reply]]] = {way: [] for way in WAYS}
    anthropic = False
    with tempfile.TemporaryDirectory(prefix="radixchat-mlx-folder-") as folder:
        print("radixchat: bench agent: saving the model as an MLX folder for mlx_lm.server",
              file=sys.stderr, flush=True)
        save_mlx_folder(root, args.model, Path(folder), template)
        for rep in range(args.repeats):
            print(f"radixchat: bench agent: repetition {rep + 1}/{args.repeats}", file=sys.stderr, flush=True)
            replies, anthropic = run_ours(root, args.model, True, trace, args.max_tokens, template)
            runs["ours_cache"].append(replies)
            runs["ours_no_cache"].append(run_ours(root, args.model, False, trace, args.max_tokens, template)[0])
            runs["mlx_lm_server"].append(run_mlx_lm_server(Path(folder), trace, args.max_tokens))
    report = _report(args, trace, runs, anthropic)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


def _report(args, trace: Trace, runs: dict[str, list[list[Reply]]], anthropic: bool) -> dict:
    import mlx.core as mx
    import mlx_lm

    sums = {way: statistics.median(sum(r.ttft_s for r in replies) for replies in reps)
            for way, reps in runs.items()}
    pairs = [(a.text, b.text) for ra, rb in zip(runs["ours_cache"], runs["ours_no_cache"]) for a, b in zip(ra, rb)]
    differing = [i for i, (a, b) in enumerate(pairs) if a != b]
    same_as_mlx = sum(a.text == b.text for a, b in zip(runs["ours_cache"][0], runs["mlx_lm_server"][0]))
    return {
        "model": args.model, "requests": len(trace.requests), "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "ours_endpoint": "/v1/messages" if anthropic else "/v1/chat/completions",
        "mlx_lm_endpoint": "/v1/chat/completions",
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "mlx": mx.__version__,
                    "mlx_lm": mlx_lm.__version__},
        "method": "a two-agent coding session with tools replayed as greedy streaming requests; TTFT = "
                  "send to first streamed piece of the reply, on the client; sums over all requests, "
                  "medians over repetitions",
        "ttft_s": {way: [[round(r.ttft_s, 4) for r in replies] for replies in reps] for way, reps in runs.items()},
        "replies_identical": not differing,
        "differing_requests": differing,
        "replies_same_as_mlx_lm_server": f"{same_as_mlx}/{len(trace.requests)}",
        "targets": {"ratio_ours_vs_ours_no_cache": 0.3, "ratio_ours_vs_mlx_lm_server": 0.9},
        "ttft_sum_s": sums,
        "ratio_ours_vs_ours_no_cache": sums["ours_cache"] / sums["ours_no_cache"],
        "ratio_ours_vs_mlx_lm_server": sums["ours_cache"] / sums["mlx_lm_server"],
    }


def format_table(report: dict) -> str:
    lines = [f"model: {report['model']}; {report['requests']} requests, {report['max_tokens']} greedy tokens "
             f"each; ours through {report['ours_endpoint']}; medians of {report['repeats']}", ""]
    for way in WAYS:
        lines.append(f"{way:>15}: TTFT summed {report['ttft_sum_s'][way]:8.2f} s")
    lines += ["", f"ours / ours without cache: {report['ratio_ours_vs_ours_no_cache']:.3f} (target <= 0.3)",
              f"ours / mlx_lm.server:      {report['ratio_ours_vs_mlx_lm_server']:.3f} (target <= 0.9)",
              f"replies the same with and without our cache: {report['replies_identical']}"]
    return "\n".join(lines)

