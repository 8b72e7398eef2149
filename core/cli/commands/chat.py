"""``radixchat chat``: its options; the turns are core/cli/chat.py's."""

from __future__ import annotations

import argparse

from core.cli.commands.options import (
    MAX_PROMPT_HELP,
    add_data_dir,
    add_kv_format,
    add_speculation,
    positive,
)


def add_parser(subparsers) -> None:
    chat = subparsers.add_parser(
        "chat", help="send one message (or chat interactively) in a session"
    )
    add_data_dir(chat)
    chat.add_argument("prompt", nargs="?", help="the message; without it, read messages from stdin")
    chat.add_argument(
        "--model", default="default", help="known name, .gguf file, MLX folder or HF repo id"
    )
    chat.add_argument("--session", help="session name (created if new; default: a fresh session)")
    # Sampling flags left out stay None: run_chat takes the engine's defaults (SamplingParams).
    chat.add_argument("--max-tokens", type=int, help="reply length limit (default: the engine's)")
    chat.add_argument(
        "--temp",
        dest="temperature",
        metavar="TEMP",
        type=float,
        help="temperature (0 = greedy; default: the engine's)",
    )
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
    add_kv_format(chat)
    chat.add_argument(
        "--weights", default="auto", help="auto | stored | float32 | float16 | bfloat16"
    )
    chat.add_argument(
        "--json", action="store_true", help="print one JSON object per turn instead of text"
    )
    chat.add_argument(
        "--chat-template", metavar="FILE", help="a Jinja chat template replacing the model's own"
    )
    chat.add_argument("--max-prompt-tokens", type=positive, metavar="N", help=MAX_PROMPT_HELP)
    add_speculation(chat)
    chat.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from core.cli.chat import run_chat

    return run_chat(args)
