"""``radixchat mcp list|add|rm|enable|disable``: the MCP tool servers of ``mcp.json``."""

from __future__ import annotations

import argparse

from core.cli.commands.options import add_data_dir

NAME = "mcp"
SUMMARY = "the MCP tool servers (mcp.json): list, add, rm, enable, disable"


def add_parser(subparsers) -> None:
    mcp = subparsers.add_parser(NAME, help=SUMMARY)
    sub = mcp.add_subparsers(dest="mcp_command", required=True)
    listing = sub.add_parser("list", help="each server, its command or URL, enabled or not")
    add_data_dir(listing)
    listing.add_argument(
        "--tools", action="store_true", help="start the servers and list their tools or errors"
    )
    listing.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for each (default: 30)"
    )
    add = sub.add_parser(
        "add",
        help="add (or replace) a server: NAME -- COMMAND ARGS... or NAME --url URL",
        usage=ADD_USAGE,
    )
    add_data_dir(add)
    add_options(add)
    # NAME, the command and options after NAME: parsed again, intermixed, by run() (argparse
    # would take options after NAME for the command's words)
    add.add_argument("words", nargs=argparse.REMAINDER, help="NAME [-- COMMAND ARGS...]")
    for name, text in (
        ("rm", "remove a server (and its secrets in the keychain)"),
        ("enable", "start a server with the app again"),
        ("disable", "keep a server but do not start it"),
    ):
        command = sub.add_parser(name, help=text)
        add_data_dir(command)
        command.add_argument("name", help="the server's name")
    mcp.set_defaults(run=run)


ADD_USAGE = "radixchat mcp add NAME [options] (-- COMMAND [ARGS...] | --url URL)"
PAIRS = {
    "--env": "an environment variable K=V for the command (repeatable)",
    "--secret-env": "an environment variable K=V kept in the OS keychain (repeatable)",
    "--header": "an HTTP header K=V (repeatable)",
    "--secret-header": "an HTTP header K=V kept in the OS keychain (repeatable)",
}


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="a streamable-HTTP server's address")
    for flag, text in PAIRS.items():
        parser.add_argument(flag, action="append", default=[], metavar="K=V", help=text)
    parser.add_argument("--disabled", action="store_true", help="add it without starting it")
    parser.add_argument(
        "--allow-read-only",
        action="store_true",
        help="run its read-only tools (readOnlyHint) without asking",
    )


def parse_add(args: argparse.Namespace) -> argparse.Namespace:
    """``add``'s words (NAME, options, ``-- COMMAND ARGS``) parsed intermixed, merged with
    the options given before NAME."""
    inner = argparse.ArgumentParser(prog="radixchat mcp add", usage=ADD_USAGE)
    inner.add_argument("--data-dir")
    add_options(inner)
    inner.add_argument("name", help="the server's name (letters, digits, _ . -)")
    inner.add_argument("command", nargs="*", help="after --: the command and its arguments")
    words = inner.parse_intermixed_args(args.words)
    for flag in PAIRS:
        key = flag[2:].replace("-", "_")
        setattr(args, key, getattr(args, key) + getattr(words, key))
    args.url = words.url or args.url
    args.disabled = args.disabled or words.disabled
    args.allow_read_only = args.allow_read_only or words.allow_read_only
    args.data_dir = words.data_dir or getattr(args, "data_dir", None)
    args.name, args.command = words.name, words.command
    return args


def run(args: argparse.Namespace) -> int:
    from core.cli.mcp import run_mcp

    if args.mcp_command == "add":
        args = parse_add(args)

    return run_mcp(args)
