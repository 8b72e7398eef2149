"""``radixchat cache stats|verify|clear``: the disk caches of session KV."""

from __future__ import annotations

import argparse

from core.cli.commands.options import JSON_HELP, add_data_dir


def add_parser(subparsers) -> None:
    cache = subparsers.add_parser(
        "cache", help="the disk cache of session KV: stats, verify, clear"
    )
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    for name, text in (
        ("stats", "sessions, pages, bytes and hit figures"),
        ("verify", "re-hash every page; drop and report bad ones"),
        ("clear", "delete cached KV (the chat history stays)"),
    ):
        command = cache_sub.add_parser(name, help=text)
        add_data_dir(command)
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
    cache.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from core.cli.cache import run_cache

    return run_cache(args)
