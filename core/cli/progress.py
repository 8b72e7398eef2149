"""Progress lines on stderr for the command line (model downloads, loading, benchmarks)."""

from __future__ import annotations

import sys

_last_progress: dict[str, float] = {}


def print_progress(message: str, fraction: float | None) -> None:
    """Progress on stderr: overwritten in place on a terminal, every 10% otherwise."""
    tty = sys.stderr.isatty()
    if fraction is not None and 0 < fraction < 1:
        step = 0.01 if tty else 0.1
        if fraction - _last_progress.get(message, -1.0) < step:
            return
    _last_progress[message] = fraction if fraction is not None else 0.0
    suffix = f" {fraction * 100:5.1f}%" if fraction is not None else ""
    end = "\r" if tty and fraction is not None and fraction < 1 else "\n"
    print(f"radixchat: {message}{suffix}", end=end, file=sys.stderr, flush=True)
