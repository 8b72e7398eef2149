"""The ``radixchat`` command.

    radixchat                      open the app
    radixchat chat [PROMPT]        one turn (or an interactive loop) in a chat session
    radixchat serve                the OpenAI- and Anthropic-compatible API on 127.0.0.1:8000
    radixchat serve --hosts FILE   the same, the model split over several machines
                                   (mlx.launch, ring/jaccl)
    radixchat models               what models are available locally (size, last use)
    radixchat models rm NAME       delete a downloaded model and its cached KV
    radixchat search QUERY         MLX and GGUF models on the Hugging Face hub, and whether
                                   each fits
    radixchat pull REPO[:FILE]     download a model from the hub into the HF cache (resumes)
    radixchat fetch-model [NAME]   provision a known model into the data folder
    radixchat cache stats|verify|clear   the disk caches of session KV (this machine's, each rank's)
    radixchat chats verify         list the chat history's damaged rows
    radixchat mcp list|add|rm      the MCP tool servers (mcp.json; enable, disable too)
    radixchat bench NAME           a benchmark (code in bench/ of a source checkout, not in the
                                   packaged app; radixchat bench --help lists them)

Each command is declared by its module in core/cli/commands/ (its parser, and the function
that runs it, which imports the command's code only then); this module builds the table
and dispatches. ``radixchat --help`` lists the user's commands, then the developers'
(``bench``); hidden commands (``_launch-group``: MLX's launcher, run by ``serve --hosts``)
take their arguments raw and are listed nowhere.

Errors meant for the user print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from core.cli.commands import (
    bench,
    cache,
    chat,
    chats,
    fetch_model,
    mcp,
    models,
    pull,
    root,
    search,
    serve,
)
from core.errors import UserError

EXIT_USER_ERROR = 2
USER_COMMANDS = (
    chat,
    serve,
    models,
    search,
    pull,
    fetch_model,
    cache,
    chats,
    mcp,
)  # in --help's order
DEVELOPER_COMMANDS = (bench,)  # listed apart, after the user's


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixchat",
        description="Chat with local language models on MLX. Without a command: open the app.",
        epilog=_listing("for developers", DEVELOPER_COMMANDS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    root.add_options(parser)
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for command in USER_COMMANDS + DEVELOPER_COMMANDS:
        command.add_parser(commands)
    return parser


def _listing(title: str, commands) -> str:
    """A section of --help for commands argparse does not list (they have no ``help=``),
    laid out as argparse lays out the user's."""
    return "\n".join([f"{title}:", *(f"    {c.NAME:<19}{c.SUMMARY}" for c in commands)])


# Opens the app, or runs what needs Qt (--screenshot), from the parsed arguments
# and the data folder. app.launcher passes it in: core never imports app.
GuiRunner = Callable[[argparse.Namespace, Path], int]


def main(argv: list[str] | None = None, gui: GuiRunner | None = None) -> int:
    """Run the command line; ``gui`` opens the app (``app.launcher`` passes it in, since
    core never imports app)."""
    argv = sys.argv[1:] if argv is None else argv
    # a hidden command (its module is imported only then)
    if argv[:1] and argv[0].startswith("_"):
        from core.distributed.launch import LAUNCH_COMMAND, run_launcher

        if argv[0] == LAUNCH_COMMAND:  # MLX's launcher, run by `serve --hosts` (even in the app)
            return run_launcher(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        run = root.run_self_test if args.self_test else getattr(args, "run", None)
        if run is not None:
            return run(args)
        if gui is None:  # no command: the app (or its --screenshot)
            raise UserError("the desktop app is not available in this build; try `radixchat chat`")
        from core import paths

        return gui(args, paths.data_dir(args.data_dir))
    except UserError as exc:
        from core.cli.terminal import safe

        print(f"radixchat: error: {safe(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
