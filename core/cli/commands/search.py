"""``radixchat search QUERY``: MLX and GGUF models on the Hugging Face hub."""

from __future__ import annotations

import argparse

from core.cli.commands.options import add_data_dir


def add_parser(subparsers) -> None:
    search = subparsers.add_parser(
        "search", help="search the Hugging Face hub for MLX and GGUF models"
    )
    add_data_dir(search)
    search.add_argument("query", help="words to look for in model names (like qwen 0.5b)")
    search.add_argument("--limit", type=int, default=20, help="results per kind (MLX, GGUF)")
    search.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from core.cli.hub import run_search

    return run_search(args)
