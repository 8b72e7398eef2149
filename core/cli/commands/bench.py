"""``radixchat bench NAME``: the benchmarks. Listed apart from the user's commands in
``radixchat --help``.

Their code is not part of the product: it lives in the top-level ``bench/`` package of a
source checkout (docs/benchmarks.md), which the packaged app leaves out. :data:`BENCHES` is
the table: each bench's name, the ``"bench.module:function"`` that runs it, its help line
and a function that adds its options; :func:`run_bench` imports the module by its name
when the bench runs (the product never imports ``bench``), and where it is missing (the
packaged app, which PyInstaller marks ``sys.frozen``) says so in one line.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

from core.cli.commands.options import JSON_HELP, MODEL_HELP, REPEATS_HELP, add_data_dir, positive
from core.errors import UserError

NAME = "bench"
SUMMARY = (
    "benchmarks (radixchat bench --help lists them)"  # radixchat --help's line, "for developers"
)
PACKAGE = "bench"
NOT_PACKAGED = "benchmarks are not in the packaged app: run them from a source checkout"
# a checkout installed before bench/ was a package of it, run from elsewhere
NOT_INSTALLED = (
    "the benchmarks (bench/ of a source checkout) are not importable here: run radixchat "
    "from the checkout's folder, or install it again (pip install -e .)"
)
MEDIANS_HELP = "repetitions (medians are reported)"
# the small task bench clients gives each coding agent
CLIENTS_TASK = "Create a file named hello.txt that contains the word hi."


@dataclass(frozen=True)
class Bench:
    """One row of the table: ``radixchat bench NAME [options]`` runs ``target``."""

    name: str
    target: str  # "bench.module:function": the function takes the parsed arguments
    help: str
    add_options: Callable[[argparse.ArgumentParser], None]  # its options; --json follows them
    # (option, target): where the option is set, that target runs instead
    instead: tuple[str, str] | None = None

    def run(self, args: argparse.Namespace) -> int:
        if self.instead is not None and getattr(args, self.instead[0]):
            return run_bench(self.instead[1], args)
        return run_bench(self.target, args)


def run_bench(target: str, args: argparse.Namespace) -> int:
    """Import ``target``'s module by name and call its function with ``args``."""
    module_name, _, function = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != PACKAGE:  # a module the bench needs, not the benchmarks themselves
            raise
        raise UserError(NOT_PACKAGED if getattr(sys, "frozen", False) else NOT_INSTALLED) from None
    return getattr(module, function)(args)


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser(
        NAME,
        description="The benchmarks: each prints its figures (one JSON object "
        "with --json); docs/benchmarks.md has what they measured.",
    )
    # (no help=: argparse does not list it among the user's commands; core.cli.main lists it apart)
    benches = bench.add_subparsers(dest="bench_command", required=True)
    for entry in BENCHES:
        parser = benches.add_parser(entry.name, help=entry.help)
        entry.add_options(parser)
        parser.add_argument("--json", action="store_true", help=JSON_HELP)
        parser.set_defaults(run=entry.run)


def _with_model(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_data_dir(parser)
    parser.add_argument("--model", default="default", help=MODEL_HELP)
    return parser


def _hostile(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument(
        "--scenes",
        nargs="+",
        choices=("quiet", "flood", "greedy", "tools"),
        help="default: all (quiet: nobody attacking, the reference)",
    )
    for flag, default, what in (
        ("--connections", 2100, "flood: half-sent request heads held"),
        ("--streams", 16, "greedy: key A's streams that are never read"),
        ("--long-tokens", 2000, "greedy: each stream's max_tokens"),
        ("--tools", 30_000, "tools: tools in each of key A's bodies"),
        ("--probes", 5, "the other client's requests per scene"),
        ("--kv-tokens", 32768, "the server's KV pool, in tokens"),
    ):
        p.add_argument(flag, type=positive, default=default, help=what)


def _cpu(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    p.add_argument(
        "--prompt-tokens", type=int, default=256, help="prompt length (default: %(default)s)"
    )
    p.add_argument(
        "--decode-tokens",
        type=int,
        default=32,
        help="tokens decoded after it (default: %(default)s)",
    )


def _multiturn(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument("--turns", type=int, default=8, help="turns of the chat (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=48, help="reply length per turn")
    p.add_argument("--repeats", type=int, default=3, help=MEDIANS_HELP)
    p.add_argument("--page-size", type=int, help="tokens per KV page")
    p.add_argument(
        "--segment-mb",
        type=float,
        help="the KV pool grows by this many MiB at a time (0: all at once; default 32)",
    )


def _restore(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument("--tokens", type=int, default=2000, help="length of the session's history")
    p.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    p.add_argument(
        "--api",
        action="store_true",
        help="an unnamed API client's prompt (disk tier by tokens) instead of a chat session",
    )


def _pressure(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument("--clients", type=int, default=16, help="clients cycling through their prompts")
    p.add_argument("--tokens", type=int, default=1000, help="each client's prompt length")
    p.add_argument("--rounds", type=int, default=3, help="times each client sends its prompt")
    p.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)


def _distributed(p: argparse.ArgumentParser) -> None:
    add_data_dir(p)
    p.add_argument("--model", help="a model that splits over 2 (default: a generated llama)")
    p.add_argument("--prompt-tokens", default="128,1024", help="prompt lengths, comma separated")
    p.add_argument("--max-tokens", type=int, default=32, help="reply length")
    p.add_argument("--kv-tokens", type=int, default=16384, help="KV pool of each server, in tokens")
    p.add_argument("--repeats", type=int, default=3, help=MEDIANS_HELP)
    p.add_argument(
        "--split",
        choices=("tensor", "pipeline"),
        default="tensor",
        help="how the 2 ranks split the model (pipeline: the default model is a qwen2)",
    )


def _serve(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument(
        "--streams",
        type=int,
        nargs="+",
        metavar="N",
        help="concurrent clients, besides one (default: 4; 4 8 with --against)",
    )
    p.add_argument(
        "--against",
        choices=("mlx-lm",),
        help="also mlx_lm.server on the same weights; both servers as subprocesses, "
        "interleaved run by run",
    )
    p.add_argument("--max-tokens", type=int, default=64, help="reply length per request")
    p.add_argument("--repeats", type=int, default=3, help=MEDIANS_HELP)


def _agent(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument("--max-tokens", type=int, default=16, help="reply length per request")
    p.add_argument("--repeats", type=int, default=1, help=MEDIANS_HELP)
    p.add_argument("--rounds", type=int, default=10, help="tool rounds per agent")
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template that takes tools (for models whose own does not)",
    )
    p.add_argument(
        "--endpoint",
        choices=("messages", "chat"),
        default="messages",
        help="drive our server through /v1/messages (Anthropic) or /v1/chat/completions "
        "(mlx_lm.server always gets /v1/chat/completions)",
    )
    p.add_argument(
        "--nocache-every",
        type=int,
        default=1,
        metavar="K",
        help="our server without cache runs only every K-th request (the ratio is taken "
        "over those; 1: all of them)",
    )
    p.add_argument("--skip-nocache", action="store_true", help="leave out our server without cache")


def _tool_loop(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument("--steps", type=positive, default=4, help="tool steps (default: 4)")
    p.add_argument(
        "--restart-after",
        type=positive,
        default=2,
        help="the second run restarts the engine after this step (default: 2)",
    )
    p.add_argument(
        "--mcp-command",
        default="npx -y @modelcontextprotocol/server-filesystem {folder}",
        help="the MCP server's command line; {folder}: the scratch folder of three files "
        "(default: the npm filesystem server through npx)",
    )
    p.add_argument("--tools", help="the tools offered, comma-separated (default: all)")
    p.add_argument(
        "--answer-tokens", type=positive, default=48, help="the last answer's tokens (default: 48)"
    )
    p.add_argument(
        "--pool-tokens", type=positive, default=16384, help="the KV pool, tokens (default: 16384)"
    )


def _fork(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument("--turns", type=positive, default=4, help="the chat's turns (default: 4)")
    p.add_argument(
        "--lines",
        type=positive,
        default=12,
        help="lines of travel notes in each user message (default: 12, about 260 tokens)",
    )
    p.add_argument(
        "--pool-tokens", type=positive, default=16384, help="the KV pool, tokens (default: 16384)"
    )
    p.add_argument("--repeats", type=positive, default=3, help=REPEATS_HELP)


def _followup(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument(
        "--prefix-tokens",
        type=positive,
        nargs="+",
        default=[1500, 2000, 2500],
        metavar="N",
        help="cached prefix sizes, tokens (default: 1500 2000 2500)",
    )
    p.add_argument(
        "--new-tokens",
        type=positive,
        nargs="+",
        default=[150, 250],
        metavar="N",
        help="new tokens in each follow-up (default: 150 250)",
    )
    p.add_argument("--max-tokens", type=positive, default=4, help="reply length of a follow-up")
    p.add_argument("--repeats", type=positive, default=3, help=REPEATS_HELP)


def _clients(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    # an instruct model with tools and a 32k context (gemma3-270m, a base model, never ends a turn)
    p.set_defaults(model="qwen2.5-coder-0.5b")
    p.add_argument("--claude", metavar="PATH", help="Claude Code (default: claude on PATH)")
    p.add_argument("--codex", metavar="PATH", help="Codex (default: codex on PATH)")
    p.add_argument("--task", default=CLIENTS_TASK, help="what each client is asked to do")
    p.add_argument(
        "--max-turns", type=positive, default=3, help="Claude Code's --max-turns (default: 3)"
    )
    p.add_argument(
        "--timeout-s", type=positive, default=3600, help="the longest one client may run"
    )
    p.add_argument(
        "--max-output-tokens",
        type=positive,
        default=512,
        metavar="N",
        help="a reply's tokens: the server's ceiling (Codex sets no limit) and Claude Code's "
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS (default: 512; a model that does not end its turn "
        "would have a CPU decode the context's rest for an hour)",
    )
    p.add_argument("--kv-tokens", type=positive, help="the server's KV pool, in tokens")
    p.add_argument(
        "--no-mlx-lm",
        action="store_true",
        help="skip asking mlx_lm.server (it serves neither client's endpoint)",
    )


def _constrain(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument("--max-tokens", type=int, default=48, help="reply length per request")
    p.add_argument("--repeats", type=int, default=3, help=MEDIANS_HELP)
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template that takes tools "
        "(for models whose own does not: the tool_required mode needs one)",
    )


def _fairness(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument("--long-tokens", type=int, default=3000, help="the long prompt's length, tokens")
    p.add_argument("--max-tokens", type=int, default=64, help="the stream's reply alone, tokens")
    p.add_argument("--repeats", type=int, default=3, help=MEDIANS_HELP)


def _key_fairness(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument("--long-tokens", type=int, default=6000, help="key A's one long prompt, tokens")
    p.add_argument("--queue", type=int, default=3, help="key A's queue: prompts")
    p.add_argument(
        "--queue-tokens", type=int, default=1650, help="key A's queue: each prompt, tokens"
    )
    p.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)


def _pull(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mb", type=int, default=500, help="size of the weights file, MiB")
    p.add_argument("--repeats", type=int, default=3, help=MEDIANS_HELP)


def _switch(p: argparse.ArgumentParser) -> None:
    add_data_dir(p)
    p.add_argument(
        "--models",
        nargs=2,
        default=["default", "gemma3-270m"],
        metavar="MODEL",
        help="the two models switched between (default: default gemma3-270m)",
    )
    p.add_argument("--switches", type=positive, default=5, help="model loads after the first")
    p.add_argument("--pool-mb", type=positive, default=64, help="the KV pool, MiB")


def _kv_quality(p: argparse.ArgumentParser) -> None:
    add_data_dir(p)
    p.add_argument(
        "--models",
        nargs="+",
        metavar="MODEL",
        help="models to measure, each a known name, .gguf file, MLX folder or HF repo id "
        "(default: default gemma3-270m)",
    )
    p.add_argument(
        "--prompts", type=positive, default=20, help="chat prompts (default: %(default)s)"
    )
    p.add_argument(
        "--max-tokens", type=positive, default=256, help="greedy reply length (default: 256)"
    )
    _kv_group_size(p)


def _kv_capacity(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument(
        "--tokens", type=positive, default=1024, help="the session's length (default: 1024)"
    )
    p.add_argument(
        "--budget-mb", type=positive, default=256, help="the pool's RAM budget (default: 256)"
    )
    p.add_argument(
        "--decode-tokens", type=positive, default=128, help="tokens decoded (default: 128)"
    )
    _kv_group_size(p)
    p.add_argument("--repeats", type=positive, default=3, help=REPEATS_HELP)


def _kv_group_size(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--group-size", type=int, choices=(32, 64, 128), default=64, help="KV quantization group"
    )


def _speculative(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument(
        "--cases", nargs="+", choices=("rewrite", "json", "chat", "four"), help="default: all"
    )
    p.add_argument(
        "--max-tokens", type=positive, default=200, help="reply length (default: %(default)s)"
    )
    p.add_argument("--repeats", type=positive, default=3, help=REPEATS_HELP)


def _llamacpp(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument("--prompts", type=positive, default=5, help="prompts (at most 5)")
    p.add_argument(
        "--max-tokens", type=positive, default=32, help="reply length (default: %(default)s)"
    )
    p.add_argument("--threads", type=positive, default=2, help="llama.cpp's threads")


def _soak(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    for flag, kind, default, what in (
        ("--minutes", float, 60, "how long the clients run"),
        ("--disk-budget-mb", float, 64, "the server's --disk-budget, MB: small, so stores evict"),
        ("--kv-tokens", positive, 8192, "the server's KV pool, tokens"),
        ("--max-tokens", positive, 32, "a reply's tokens"),
        ("--mirror-share", float, 0.25, "greedy conversations also sent to --no-cache"),
        ("--sample-s", float, 15, "seconds between samples"),
        ("--request-timeout-s", float, 300, "every request's timeout, seconds"),
    ):
        p.add_argument(flag, type=kind, default=default, help=f"{what} (default: {default:g})")


def _gui(p: argparse.ArgumentParser) -> None:
    _with_model(p)
    p.add_argument("--max-tokens", type=int, default=128, help="reply length")
    p.add_argument("--repeats", type=int, default=3, help="replies measured (medians are reported)")


# `radixchat bench --help` lists them in this order
BENCHES = (
    Bench(
        "hostile",
        "bench.hostile:run_bench_hostile",
        "what a flood of connections, a client that never reads and a "
        "huge body cost another client (target: answers within 2 s)",
        _hostile,
    ),
    Bench(
        "cpu", "bench.cpu:run_bench_cpu", "CPU backend setups: OpenBLAS and weight formats", _cpu
    ),
    Bench(
        "multiturn",
        "bench.multiturn:run_bench_multiturn",
        "a greedy N-turn chat: cached vs uncached vs mlx-lm",
        _multiturn,
    ),
    Bench(
        "restore",
        "bench.restore:run_bench_restore",
        "TTFT after a restart: restored vs recomputed vs RAM",
        _restore,
        instead=("api", "bench.restore_api:run_bench_restore_api"),
    ),
    Bench(
        "pressure",
        "bench.pressure:run_bench_pressure",
        "a pool a quarter of the working set: disk tier vs RAM only",
        _pressure,
    ),
    Bench(
        "distributed",
        "bench.distributed:run_bench_distributed",
        "the same greedy chat on 1 process and split over 2 "
        "ranks on loopback: TTFT and decode, cached and not",
        _distributed,
    ),
    Bench(
        "serve",
        "bench.serve:run_bench_serve",
        "API decode throughput: N concurrent streaming clients "
        "vs one (--against mlx-lm: and vs mlx_lm.server)",
        _serve,
        instead=("against", "bench.serve_against:run_bench_serve_against"),
    ),
    Bench(
        "agent",
        "bench.agent:run_bench_agent",
        "a coding-agent session with tools: TTFT, ours vs ours without cache vs mlx_lm.server",
        _agent,
    ),
    Bench(
        "followup",
        "bench.followup:run_bench_followup",
        "a follow-up's new tokens on a cached prefix: TTFT, ours vs mlx_lm.server",
        _followup,
    ),
    Bench(
        "fork",
        "bench.fork:run_bench_fork",
        "a branch's first reply: TTFT with its history in RAM, after a restart (disk) "
        "and recomputed",
        _fork,
    ),
    Bench(
        "tool-loop",
        "bench.tool_loop:run_bench_tool_loop",
        "an agent's tool loop through an MCP server: each step's prompt, cached and "
        "computed tokens, in RAM and with a restart mid-loop",
        _tool_loop,
    ),
    Bench(
        "clients",
        "bench.clients:run_bench_clients",
        "Claude Code and Codex, as installed, against our server: per request its "
        "dialect, prompt and cached tokens, TTFT; and whether each finished",
        _clients,
    ),
    Bench(
        "constrain",
        "bench.constrain:run_bench_constrain",
        "what constrained decoding costs per token",
        _constrain,
    ),
    Bench(
        "fairness",
        "bench.fairness:run_bench_fairness",
        "a stream's inter-token gaps while another client's long prompt is prefilled",
        _fairness,
    ),
    Bench(
        "key-fairness",
        "bench.key_fairness:run_bench_key_fairness",
        "another API key's short chat behind one key's long prompts: its time to "
        "first token, prefill shared between keys and as before",
        _key_fairness,
    ),
    Bench(
        "pull",
        "bench.pull:run_bench_pull",
        "`radixchat pull` from a loopback hub vs curl (source checkout)",
        _pull,
    ),
    Bench(
        "switch",
        "bench.switch:run_bench_switch",
        "RSS and MLX memory after switching models, against a fresh start (target: 10 %%)",
        _switch,
    ),
    Bench(
        "kv-quality",
        "bench.kv_quality:run_bench_kv_quality",
        "quantized KV (8-bit, 4-bit) against full precision: greedy agreement and the "
        "log-likelihood of a reference text (target: 8-bit agrees on >= 95%% of tokens)",
        _kv_quality,
    ),
    Bench(
        "kv-capacity",
        "bench.kv_capacity:run_bench_kv_capacity",
        "quantized KV against full precision in one run: tokens the pool holds in "
        "one RAM budget, disk bytes per token, restore after a restart, decode tok/s",
        _kv_capacity,
    ),
    Bench(
        "speculative",
        "bench.speculative:run_bench_speculative",
        "decode speed with speculation (drafts from the prompt and the cache) vs "
        "without and vs mlx_lm.server: a file rewritten, JSON reformatted, a chat, four "
        "at once (targets: 2.0x mlx_lm.server, 1.8x without, 0.97x, 1.5x)",
        _speculative,
    ),
    Bench(
        "llamacpp",
        "bench.llamacpp:run_bench_llamacpp",
        "a GGUF's greedy replies from RadixChat and from llama.cpp (llama-cpp-python) "
        "on the same prompt token ids",
        _llamacpp,
    ),
    Bench(
        "soak",
        "bench.soak:run_bench_soak",
        "8 clients of the three dialects for N minutes, a restart half way: RSS, "
        "open files, each store's disk use, errors, replies against --no-cache (targets: "
        "RSS flat within 5%%, stores within budget, no 5xx, no mismatch)",
        _soak,
    ),
    # the one that drives the window (bench/gui.py imports the app)
    Bench(
        "gui",
        "bench.gui:run_bench_gui",
        "the app's event-loop latency while a reply streams",
        _gui,
    ),
)
