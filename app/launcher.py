"""The ``radixchat`` console entry point: the core CLI, with the desktop app plugged in."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from core.cli.main import main as cli_main


def _run_gui(args: argparse.Namespace, data_root: Path) -> int:
    """What needs Qt: the app itself and ``--screenshot PATH``."""
    if args.screenshot:
        from app.screenshot import run_screenshot

        return run_screenshot(Path(args.screenshot), data_root, args.model)
    from app.run import run_app

    chosen = args.data_dir is not None or bool(os.environ.get("RADIXCHAT_HOME"))
    return run_app(
        data_root,
        args.model,
        data_root_chosen=chosen,
        kv_bits=args.kv_bits,
        kv_group_size=args.kv_group_size,
    )


def main(argv: list[str] | None = None) -> int:
    return cli_main(argv, gui=_run_gui)


if __name__ == "__main__":
    sys.exit(main())
