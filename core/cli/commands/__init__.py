"""The commands of ``radixchat``, one module each.

A command's module declares its parser and what runs it: ``add_parser(subparsers)`` adds
the command with its options, their defaults and their help, and ``set_defaults(run=...)``
names a function of the module that runs the parsed command. That function imports the
command's code (``core.cli.chat``, ``core.cli.serve``, ...) when it runs (``bench.py``
imports each benchmark of the top-level ``bench`` package by its name, from one table):
these modules import nothing heavier than ``argparse``, so ``core.cli.main`` builds the
whole table without the engine, MLX or the API server, and ``radixchat pull`` starts light.
"""
