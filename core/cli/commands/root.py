"""``radixchat``'s own options, before any command: the app's (``--model``,
``--screenshot``), ``--self-test``, ``--version`` and ``--verbose``."""

from __future__ import annotations

import argparse
import platform

from core.cli.commands.options import add_data_dir, add_kv_format


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version",
        action=VersionAction,
        help="print the versions of radixchat, MLX, mlx-lm and Python, and exit",
    )
    add_data_dir(parser, top_level=True)
    parser.add_argument(
        "--model", default="default", help="model for the app (default: SmolLM2-135M)"
    )
    add_kv_format(parser)  # the app's: over its Preferences
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


def run_self_test(args: argparse.Namespace) -> int:
    from core.cli.self_test import run_self_test

    return run_self_test(args)


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


class VersionAction(argparse.Action):
    """``--version``: print :func:`version_line` and exit (read only when asked)."""

    def __init__(
        self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None
    ):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()
