"""``radixchat bench agent``: a coding-agent session replayed three ways, time to first
token summed over every request.

The trace (``bench.agent_trace``): two agents on one ~2,000-token system prompt
with tool definitions, ten rounds of tool call and result each (outputs of 100-300
tokens), one turn with a stop sequence each, interleaved. Every request streams a greedy
reply of ``--max-tokens`` tokens. The three ways, each a server in its own process:

1. ``ours_cache``: ``radixchat serve`` with its prefix cache (a fresh data folder, so
   nothing is cached before the first request);
2. ``ours_no_cache``: ``radixchat serve --no-cache`` (every prompt computed whole);
3. ``mlx_lm_server``: ``mlx_lm.server`` (its prompt cache on, the default), on the same
   weights saved as an MLX folder (it reads no GGUF), with the same chat template,
   started after ``import core`` so its CPU backend is set up the way ours is; through
   its OpenAI API with the same messages.

The ways run interleaved, request by request: request *i* goes to each server in turn
(the order rotates with *i*) before request *i+1* goes to any, so a change of load on
the machine hits all three alike. Each server sees the trace in order, one request at a
time, as an agent would send it. Our server gets ``/v1/messages`` (Anthropic) or
``/v1/chat/completions`` (``--endpoint``); mlx_lm.server gets ``/v1/chat/completions``.
A request's TTFT is the time from sending it to the first streamed piece of the reply
(text, or a tool call), on the client; its cached tokens are what the server's usage
says its cache served. Before the trace, one unrelated warm-up request per server loads
what loads lazily. Each repetition starts fresh servers.

The way without cache computes every prompt whole, so its time per request does not
depend on the requests before: ``--nocache-every K`` sends it only every K-th request
(from the first), and its ratio is taken over those requests; ``--skip-nocache`` leaves
it out. ``--json`` ends with ``ttft_sum_s`` for each way and the ratios;
``replies_identical`` says whether every reply came out the same with and without our
cache (greedy).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.agent_trace import Trace, anthropic_body, build_trace, openai_body
from bench.harness import link_models, repetitions
from bench.server_process import (
    ServerProcess,
    free_port,
    mlx_lm_server_code,
    radixchat_server_code,
)
from core import paths
from core.errors import UserError
from core.models.load.chat_template import read_chat_template

WAYS = ("ours_cache", "ours_no_cache", "mlx_lm_server")
POOL_TOKENS = 65536
STOP_TIMEOUT_S = 60  # a server still busy with a long prompt takes a while to stop
REQUEST_TIMEOUT_S = 900
MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Reply:
    """One streamed request as the client saw it."""

    ttft_s: float
    total_s: float
    text: str  # the reply's text, then its tool calls as JSON
    prompt_tokens: int | None = None  # from the server's usage, when it sends one
    cached_tokens: int | None = None  # the prompt tokens its cache served

    @property
    def computed_tokens(self) -> int | None:
        if self.prompt_tokens is None or self.cached_tokens is None:
            return None
        return self.prompt_tokens - self.cached_tokens


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
    text, calls, usage = [], {}, {}
    try:
        conn.request(
            "POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})}
        )
        response = conn.getresponse()
        if response.status != 200:
            raise UserError(
                f"bench agent: {path} answered {response.status}: {response.read()[:300]!r}"
            )
        for event, data in _sse_events(response):
            piece = _piece(path, event, data, text, calls)
            if piece and first is None:
                first = time.perf_counter()
            _usage(path, data, usage)
            if event == "message_stop":
                break
    finally:
        conn.close()
    ended = time.perf_counter()
    return Reply(
        (first or ended) - sent,
        ended - sent,
        "".join(text) + "".join(json.dumps(c, sort_keys=True) for c in calls.values()),
        usage.get("prompt"),
        usage.get("cached"),
    )


def _usage(path: str, data: dict, usage: dict) -> None:
    """Note the prompt and cached tokens ``data`` reports (Anthropic's message_start and
    message_delta; OpenAI's usage chunk)."""
    if path.endswith("/messages"):
        found = data.get("usage") or (data.get("message") or {}).get("usage")
        if found and "input_tokens" in found:
            cached = found.get("cache_read_input_tokens") or 0
            usage.update(prompt=found["input_tokens"] + cached, cached=cached)
        return
    found = data.get("usage")
    if found and "prompt_tokens" in found:
        usage.update(
            prompt=found["prompt_tokens"],
            cached=(found.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
        )


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


def request_body(trace: Trace, index: int, max_tokens: int, path: str) -> dict:
    """Request ``index`` of the trace in the wire form of ``path``."""
    if path == MESSAGES:
        return anthropic_body(trace, trace.requests[index], max_tokens)
    return {
        **openai_body(trace, trace.requests[index], max_tokens),
        "stream_options": {"include_usage": True},
    }


def warm_up(server: Served) -> None:
    """One short unrelated request: what loads lazily loads before the trace."""
    body = {
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
    }
    if server.path == MESSAGES:
        body["model"] = "claude-sonnet-4-5"
    stream(server.host, server.port, server.path, body)


# ------------------------------------------------------------------ the servers
@dataclass
class Served:
    """A server in its own process (a started :class:`ServerProcess`; None: a test's
    stand-in), answering at ``host:port``, and the endpoint the bench sends it requests on."""

    name: str
    host: str
    port: int
    path: str
    server: ServerProcess | None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def _start(name: str, code: str, port: int, path: str) -> Served:
    server = ServerProcess(name, code, port, stop_timeout_s=STOP_TIMEOUT_S).start()
    return Served(name, server.host, port, path, server)


def start_ours(
    data: Path, model: str, use_cache: bool, path: str = MESSAGES, template_file: str | None = None
) -> Served:
    """``radixchat serve`` on data folder ``data`` (its caches there), with or without its
    cache, in its own process (as mlx_lm.server runs), on a free loopback port."""
    port = free_port()
    code = radixchat_server_code(
        model, data, port, POOL_TOKENS, use_cache=use_cache, chat_template=template_file
    )
    return _start("ours_cache" if use_cache else "ours_no_cache", code, port, path)


def start_mlx_lm_server(folder: Path) -> Served:
    """``mlx_lm.server`` on the MLX model ``folder`` (its prompt cache on, the default),
    after ``import core`` (the same CPU setup as ours), on a free loopback port."""
    port = free_port()
    return _start("mlx_lm_server", mlx_lm_server_code(folder, port), port, CHAT)


def run_mlx_lm_server(folder: Path, trace: Trace, max_tokens: int) -> list[Reply]:
    """The trace through ``mlx_lm.server`` alone (a subprocess, its prompt cache on)."""
    server = start_mlx_lm_server(folder)
    try:
        warm_up(server)
        return [
            stream(server.host, server.port, CHAT, request_body(trace, i, max_tokens, CHAT))
            for i in range(len(trace.requests))
        ]
    finally:
        server.stop()


def save_mlx_folder(root: Path, model: str, folder: Path, template: str | None = None) -> None:
    """Load ``model`` the way the engine does and save it as an MLX model folder that
    ``mlx_lm.load`` reads: the same (quantized) weights, config and tokenizer, the chat
    template included."""
    import mlx.nn as nn
    from mlx_lm.utils import save_config, save_model

    from core.models.load.loader import load_model

    loaded = load_model(model, root, chat_template=template)
    config = dict(loaded.config)
    quantized = {
        name: {"group_size": m.group_size, "bits": m.bits, "mode": getattr(m, "mode", "affine")}
        for name, m in loaded.model.named_modules()
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
    }
    if quantized:
        first = next(iter(quantized.values()))
        config["quantization"] = {**first, **quantized}
    config["eos_token_id"] = sorted(loaded.tokenizer.eos_token_ids)
    save_model(folder, loaded.model)
    save_config(config, folder / "config.json")
    loaded.tokenizer.save_pretrained(str(folder))


# ------------------------------------------------------------------ the bench
def replay_interleaved(
    servers: list[Served], trace: Trace, max_tokens: int, only: dict[str, set[int]] | None = None
) -> dict[str, list[Reply | None]]:
    """Every request of the trace to every server, request by request: request ``i`` goes
    to each server in turn, the order rotated by ``i``, before request ``i + 1`` goes to
    any. ``only[name]``: the requests that server gets (the others are None)."""
    replies: dict[str, list[Reply | None]] = {s.name: [] for s in servers}
    for i in range(len(trace.requests)):
        turn = servers[i % len(servers) :] + servers[: i % len(servers)]
        for server in turn:
            if only is not None and server.name in only and i not in only[server.name]:
                replies[server.name].append(None)
                continue
            reply = stream(
                server.host,
                server.port,
                server.path,
                request_body(trace, i, max_tokens, server.path),
            )
            replies[server.name].append(reply)
        print(
            f"radixchat: bench agent: request {i + 1}/{len(trace.requests)}, TTFT "
            + ", ".join(
                f"{name} {r[-1].ttft_s:.2f} s" for name, r in replies.items() if r[-1] is not None
            ),
            file=sys.stderr,
            flush=True,
        )
    return replies


def _repetition(
    root: Path, args, folder: Path, trace: Trace, ways: tuple[str, ...], nocache_requests: set[int]
) -> dict[str, list[Reply | None]]:
    """One repetition: fresh servers for ``ways``, the trace through all of them, interleaved."""
    path = MESSAGES if args.endpoint == "messages" else CHAT
    with contextlib.ExitStack() as stack:
        servers = []
        for way in ways:
            if way == "mlx_lm_server":
                server = start_mlx_lm_server(folder)
            else:
                data = Path(
                    stack.enter_context(
                        tempfile.TemporaryDirectory(prefix=f"radixchat-bench-{way}-")
                    )
                )
                link_models(root, data)
                server = start_ours(data, args.model, way == "ours_cache", path, args.chat_template)
            stack.callback(server.stop)
            servers.append(server)
        for server in servers:
            warm_up(server)
        return replay_interleaved(
            servers, trace, args.max_tokens, {"ours_no_cache": nocache_requests}
        )


def run_bench_agent(args) -> int:
    if args.max_tokens < 1 or args.repeats < 1:
        raise UserError("--max-tokens and --repeats must be at least 1")
    if args.rounds < 1:
        raise UserError("--rounds must be at least 1")
    every = getattr(args, "nocache_every", 1)
    if every < 1:
        raise UserError("--nocache-every must be at least 1")
    template = read_chat_template(args.chat_template) if args.chat_template else None
    trace = build_trace(args.rounds)
    root = paths.data_dir(args.data_dir)
    skip = getattr(args, "skip_nocache", False)
    ways = tuple(w for w in WAYS if not (skip and w == "ours_no_cache"))
    nocache_requests = set(range(0, len(trace.requests), every))
    runs: dict[str, list[list[Reply | None]]] = {way: [] for way in ways}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="radixchat-mlx-folder-") as folder:
        print(
            "radixchat: bench agent: saving the model as an MLX folder for mlx_lm.server",
            file=sys.stderr,
            flush=True,
        )
        save_mlx_folder(root, args.model, Path(folder), template)
        for _ in repetitions("agent", args.repeats):
            for way, replies in _repetition(
                root, args, Path(folder), trace, ways, nocache_requests
            ).items():
                runs[way].append(replies)
            load.append(os.getloadavg()[0])
    report = _report(args, trace, runs, sorted(nocache_requests), load)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


def _sum(replies: list[Reply | None], requests) -> float:
    return sum(replies[i].ttft_s for i in requests)


def _report(
    args,
    trace: Trace,
    runs: dict[str, list[list[Reply | None]]],
    nocache_requests: list[int],
    load: list[float],
) -> dict:
    import mlx.core as mx
    import mlx_lm

    everything = range(len(trace.requests))
    sums = {
        way: statistics.median(
            _sum(replies, everything if way != "ours_no_cache" else nocache_requests)
            for replies in reps
        )
        for way, reps in runs.items()
    }
    ours = runs["ours_cache"]
    report = {
        "model": args.model,
        "requests": len(trace.requests),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "ours_endpoint": MESSAGES if args.endpoint == "messages" else CHAT,
        "mlx_lm_endpoint": CHAT,
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "mlx": mx.__version__,
            "mlx_lm": mlx_lm.__version__,
        },
        "load_1min": [round(x, 2) for x in load],  # before the first repetition and after each
        "method": (
            "a two-agent coding session with tools replayed as greedy streaming requests to "
            "servers in their own processes, interleaved request by request; TTFT = send to "
            "first streamed piece of the reply, on the client; sums over all requests, medians "
            "over repetitions"
        ),
        "ttft_s": {
            way: [[None if r is None else round(r.ttft_s, 4) for r in replies] for replies in reps]
            for way, reps in runs.items()
        },
        "computed_tokens": {
            way: [None if r is None else r.computed_tokens for r in reps[0]]
            for way, reps in runs.items()
        },
        "computed_tokens_sum": {
            way: sum(r.computed_tokens or 0 for r in reps[0] if r is not None)
            for way, reps in runs.items()
        },
        "targets": {"ratio_ours_vs_ours_no_cache": 0.3, "ratio_ours_vs_mlx_lm_server": 0.9},
    }
    if "mlx_lm_server" in runs:
        same = sum(a.text == b.text for a, b in zip(ours[0], runs["mlx_lm_server"][0]))
        report["replies_same_as_mlx_lm_server"] = f"{same}/{len(trace.requests)}"
        # each request's two TTFTs were taken moments apart: their ratio shrugs off load spikes
        report["ratio_ours_vs_mlx_lm_server_per_request_median"] = statistics.median(
            a.ttft_s / b.ttft_s
            for ra, rb in zip(ours, runs["mlx_lm_server"])
            for a, b in zip(ra, rb)
        )
    if "ours_no_cache" in runs:
        pairs = [
            (a.text, b.text)
            for ra, rb in zip(ours, runs["ours_no_cache"])
            for i, (a, b) in enumerate(zip(ra, rb))
            if b is not None
        ]
        report["replies_identical"] = all(a == b for a, b in pairs)
        report["differing_requests"] = sorted(
            {
                i
                for ra, rb in zip(ours, runs["ours_no_cache"])
                for i, (a, b) in enumerate(zip(ra, rb))
                if b is not None and a.text != b.text
            }
        )
        report["nocache_requests"] = nocache_requests
        report["ours_cache_ttft_sum_over_nocache_requests_s"] = statistics.median(
            _sum(replies, nocache_requests) for replies in ours
        )
    report["ttft_sum_s"] = sums
    if "ours_no_cache" in runs:
        report["ratio_ours_vs_ours_no_cache"] = (
            report["ours_cache_ttft_sum_over_nocache_requests_s"] / sums["ours_no_cache"]
        )
    if "mlx_lm_server" in runs:
        report["ratio_ours_vs_mlx_lm_server"] = sums["ours_cache"] / sums["mlx_lm_server"]
    return report


def format_table(report: dict) -> str:
    lines = [
        (
            f"model: {report['model']}; {report['requests']} requests, {report['max_tokens']} "
            f"greedy tokens each; ours through {report['ours_endpoint']}; interleaved; medians "
            f"of {report['repeats']}; load {report['load_1min']}"
        ),
        "",
    ]
    nocache = report.get("nocache_requests")
    for way, total in report["ttft_sum_s"].items():
        over = (
            f" (over {len(nocache)} requests)"
            if way == "ours_no_cache" and nocache is not None
            else ""
        )
        lines.append(
            f"{way:>15}: TTFT summed {total:8.2f} s{over}, "
            f"{report['computed_tokens_sum'][way]} prompt tokens computed"
        )
    lines.append("")
    if "ratio_ours_vs_ours_no_cache" in report:
        lines.append(
            f"ours / ours without cache: {report['ratio_ours_vs_ours_no_cache']:.3f} (target <= "
            f"0.3; over the {len(nocache)} requests both ran)"
        )
    if "ratio_ours_vs_mlx_lm_server" in report:
        lines.append(
            f"ours / mlx_lm.server:      {report['ratio_ours_vs_mlx_lm_server']:.3f} (target <= "
            "0.9; per request, median "
            f"{report['ratio_ours_vs_mlx_lm_server_per_request_median']:.3f})"
        )
    if "replies_identical" in report:
        lines.append(f"replies the same with and without our cache: {report['replies_identical']}")
    return "\n".join(lines)
