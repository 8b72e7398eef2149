"""What RadixChat takes from inside MLX, in one place (issue 27).

RadixChat uses MLX's public API (``mlx.core``, ``mlx.nn``, ``mlx.utils``) everywhere else.
From further inside it takes one thing: MLX's launcher, ``mlx.launch``'s code, which lives
in the private package ``mlx._distributed_utils.launch``. The packaged app ships no
``mlx.launch`` script, so ``radixchat`` runs that code itself to start a group of Macs
(``core.distributed.launch``), and quiets one of its threads (:func:`wait_on_reads_only`).

``tests/core/test_mlx_compat.py`` checks what is relied on here and, when it fails, says
which MLX change broke what; ``pyproject.toml`` pins MLX to the range it passed on.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

LAUNCHER = "mlx._distributed_utils.launch"


def launcher_installed() -> bool:
    """Whether MLX's launcher is there (found without importing it)."""
    try:
        return importlib.util.find_spec(LAUNCHER) is not None
    except ModuleNotFoundError:
        return False


def run_launcher(argv: list[str]) -> None:
    """``mlx.launch ARGV`` in this process (it logs each rank's exit and returns nothing),
    its stdin relay quieted (:func:`wait_on_reads_only`)."""
    launcher = importlib.import_module(LAUNCHER)
    wait_on_reads_only(launcher)
    sys.argv = ["mlx.launch", *argv]
    launcher.main()


def wait_on_reads_only(launcher) -> None:
    """The launcher relays its stdin to each rank in a thread that selects on the rank's
    stdin pipe for writing, which is always writable: each thread spins, about 0.6 of a
    core for the group's whole life on a 2-rank group. Nothing is ever typed to a rank
    (serve --hosts gives the launcher a pipe nobody writes to), so the ``select`` of the
    ``launcher`` module (a global it calls) is made to wait on reads only."""
    select = launcher.select

    def select_reads(rlist, wlist, xlist, timeout=None):
        return select(rlist, [], xlist, timeout)

    launcher.select = select_reads
