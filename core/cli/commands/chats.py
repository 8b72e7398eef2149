"""``radixchat chats verify|export|import``: the chat history's damaged rows; a chat out as
Markdown or JSON, a JSON chat in as a new chat."""

from __future__ import annotations

import argparse

from core.cli.commands.options import JSON_HELP, add_data_dir


def add_parser(subparsers) -> None:
    chats = subparsers.add_parser("chats", help="the chat history: verify, export, import")
    chats_sub = chats.add_subparsers(dest="chats_command", required=True)
    chats_verify = chats_sub.add_parser(
        "verify", help="list the messages and chats that do not read back whole"
    )
    add_data_dir(chats_verify)
    chats_verify.add_argument("--json", action="store_true", help=JSON_HELP)
    export = chats_sub.add_parser(
        "export", help="write a chat as Markdown or JSON (each reply with its model and settings)"
    )
    add_data_dir(export)
    export.add_argument("chat", help="the chat's name (as `radixchat chat --session` takes it)")
    export.add_argument(
        "-o", "--output", help="the file to write (default: the terminal); .json writes JSON"
    )
    export.add_argument(
        "--format", choices=("markdown", "json"), help="default: from --output's suffix, else md"
    )
    imports = chats_sub.add_parser("import", help="a JSON chat (an export) as a new chat")
    add_data_dir(imports)
    imports.add_argument("file", help="a chat exported as JSON, or a JSON list of messages")
    imports.add_argument("--title", help="the new chat's title (default: the file's)")
    imports.add_argument("--json", action="store_true", help=JSON_HELP)
    chats.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from core.cli.chats import run_chats

    return run_chats(args)
