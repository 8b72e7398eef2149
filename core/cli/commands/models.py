"""``radixchat models [rm NAME | clean]``: the models here with the files made from them
(base models marked "base: completion only"); deleting one, by the name listed; deleting
the files made from models."""

from __future__ import annotations

import argparse

from core.cli.commands.options import add_data_dir


def add_parser(subparsers) -> None:
    models = subparsers.add_parser("models", help="list the models available locally")
    add_data_dir(models)
    models_sub = models.add_subparsers(dest="models_command")
    models_rm = models_sub.add_parser(
        "rm", help="delete a model (known, in the data folder or from the hub) and its cached KV"
    )
    add_data_dir(models_rm)
    models_rm.add_argument(
        "name",
        help="as `radixchat models` lists it: a known model's name, a file or folder in the "
        "data folder, REPO or REPO:FILE.gguf",
    )
    models_rm.add_argument("-y", "--yes", action="store_true", help="do not ask first")
    models_clean = models_sub.add_parser(
        "clean",
        help="delete the files made from models at load (tokenizers, kept conversions); "
        "the next load makes what it needs again",
    )
    add_data_dir(models_clean)
    models_clean.add_argument(
        "--gone", action="store_true", help="only those of models no longer here"
    )
    models.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from core.cli.hub import run_models

    return run_models(args)
