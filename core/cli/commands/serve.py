"""``radixchat serve``: the OpenAI-, Anthropic- and Ollama-compatible API, on this machine
(core/cli/serve.py) or with the model split over several (``--hosts``: core/cli/serve_group.py)."""

from __future__ import annotations

import argparse

from core.cli.commands.options import (
    MAX_PROMPT_HELP,
    MODEL_HELP,
    add_data_dir,
    add_kv_format,
    add_speculation,
    disk_gb,
    non_negative,
    port,
    positive,
)
from core.limits import (
    MAX_CONNECTIONS,
    MAX_OUTPUT_TOKENS,
    MAX_SCHEMA_BYTES,
    MAX_TOOLS,
    MAX_WAITING_PER_KEY,
)

OLLAMA_PORT = 11434  # where Ollama listens, and its clients look


def add_parser(subparsers) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="serve the OpenAI-, Anthropic- and Ollama-compatible API until Ctrl-C",
        description="Serve the loaded model over HTTP until Ctrl-C: OpenAI's API "
        "(/v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings), Anthropic's "
        "(/v1/messages) and Ollama's (/api/chat, /api/generate, /api/embed, /api/tags, "
        "/api/show, /api/ps, /api/pull, /api/delete, GET /) on one port; --ollama-port serves "
        "the same API on Ollama's port too, for apps that only speak Ollama's API.",
    )
    add_data_dir(serve)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to bind (beyond loopback needs --api-key)"
    )
    serve.add_argument(
        "--port",
        type=port,
        default=8000,
        help="port to listen on (0: a free one; default: %(default)s)",
    )
    serve.add_argument(
        "--ollama-port",
        type=port,
        nargs="?",
        const=OLLAMA_PORT,
        metavar="PORT",
        help=f"also listen on PORT (alone: Ollama's own, {OLLAMA_PORT}), so apps that speak "
        "only Ollama's API (Open WebUI, Continue, Raycast...) find RadixChat where they look "
        "for Ollama; the same API as --port (stop Ollama first if it holds the port)",
    )
    serve.add_argument("--model", default="default", help=MODEL_HELP)
    serve.add_argument(
        "--alias",
        action="append",
        default=[],
        metavar="NAME",
        help="another name /v1/models lists for the model (repeatable); any name a request "
        "sends is served by the loaded model anyway",
    )
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
    add_kv_format(serve)
    serve.add_argument(
        "--disk-budget",
        type=disk_gb,
        metavar="GB",
        help="the data folder's disk budget: the disk cache of KV, the files made from models "
        "and the stored responses (an eighth, at most 256 MB) together (default: 10)",
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
    serve.add_argument("--max-prompt-tokens", type=positive, metavar="N", help=MAX_PROMPT_HELP)
    add_speculation(serve)
    serve.add_argument(
        "--max-tools",
        type=positive,
        default=MAX_TOOLS,
        metavar="N",
        help=f"tools one request may bring (default: {MAX_TOOLS})",
    )
    serve.add_argument(
        "--max-schema-bytes",
        type=positive,
        default=MAX_SCHEMA_BYTES,
        metavar="N",
        help="bytes of JSON one request's tools and response schema may come to "
        f"(default: {MAX_SCHEMA_BYTES:,}; checking a schema costs ~10 µs a byte)",
    )
    serve.add_argument(
        "--max-output-tokens",
        type=non_negative,
        default=MAX_OUTPUT_TOKENS,
        metavar="N",
        help=f"reply tokens of a request that sets no limit (default: {MAX_OUTPUT_TOKENS:,}; "
        "0: up to the context); a request's own max_tokens / max_output_tokens wins",
    )
    serve.add_argument(
        "--max-waiting",
        type=positive,
        default=MAX_WAITING_PER_KEY,
        metavar="N",
        help=f"prompts one API key (or the API without keys) may have waiting for prefill "
        f"(default: {MAX_WAITING_PER_KEY}); one more is a 429",
    )
    serve.add_argument(
        "--max-connections",
        type=positive,
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
        "--ring-port", type=port, help="with --hosts: the ring's first port (default: mlx.launch's)"
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
    serve.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.group_member:
        from core.cli.serve_group import run_group_member

        return run_group_member(args)
    if args.hosts:
        from core.cli.serve_group import run_group

        return run_group(args)
    from core.cli.serve import run_serve

    return run_serve(args)
