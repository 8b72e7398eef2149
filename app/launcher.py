"""The ``radixchat`` console entry point: the core CLI, with the desktop app plugged in."""

from __future__ import annotations

import sys

from core.cli import main as cli_main


def _run_gui(data_root, model_spec: str) -> int:
    from app.main_window import run_app

    return run_app(data_root, model_spec)


def main(argv: list[str] | None = None) -> int:
    return cli_main(argv, gui=_run_gui)


if __name__ == "__main__":
    sys.exit(main())
