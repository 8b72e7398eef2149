"""``radixchat chats verify``: the chat history's damaged rows."""

from __future__ import annotations

import argparse

from core.cli.commands.options import JSON_HELP, add_data_dir


def add_parser(subparsers) -> None:
    chats = subparsers.add_parser("chats", help="the chat history: verify")
    chats_sub = chats.add_subparsers(dest="chats_command", required=True)
    chats_verify = chats_sub.add_parser(
        "verify", help="list the messages and chats that do not read back whole"
    )
    add_data_dir(chats_verify)
    chats_verify.add_argument("--json", action="store_true", help=JSON_HELP)
    chats.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from core.cli.chats import run_chats

    return run_chats(args)
