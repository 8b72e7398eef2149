"""``radixchat pull REPO[:FILE]``: a model from the Hugging Face hub into its cache."""

from __future__ import annotations

import argparse

from core.cli.commands.options import add_data_dir


def add_parser(subparsers) -> None:
    pull = subparsers.add_parser(
        "pull", help="download a model from the Hugging Face hub (resumes)"
    )
    add_data_dir(pull)
    pull.add_argument(
        "target", metavar="REPO[:FILE]", help="an MLX repo, or a GGUF repo and one of its files"
    )
    pull.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from core.cli.hub import run_pull

    return run_pull(args)
