"""What RadixChat takes from inside MLX is still there, as used (core/mlx_compat.py, issue
27): MLX's launcher (``mlx._distributed_utils.launch``), its ``main`` and the ``select`` it
calls as a module global, and that quieting that ``select`` keeps what is there to read."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
from select import select

from core.mlx_compat import LAUNCHER, launcher_installed, wait_on_reads_only

GROUPS = "groups of Macs (radixchat serve --hosts, core/distributed/launch.py)"


def installed() -> str:
    wanted = [
        r
        for r in importlib.metadata.requires("radixchat") or []
        if r.startswith("mlx") and "lm" not in r
    ]
    return (
        f"mlx {importlib.metadata.version('mlx')} (RadixChat pins {', '.join(wanted) or 'nothing'})"
    )


def test_the_launcher_is_there_with_main_and_its_select():
    assert launcher_installed(), f"{installed()}: {LAUNCHER} is gone; this breaks {GROUPS}"
    launcher = importlib.import_module(LAUNCHER)
    assert callable(getattr(launcher, "main", None)), (
        f"{installed()}: {LAUNCHER}.main is gone; this breaks {GROUPS}"
    )
    assert not inspect.signature(launcher.main).parameters, (
        f"{installed()}: {LAUNCHER}.main now takes arguments (it read sys.argv); this breaks "
        f"{GROUPS}"
    )
    # (its select may be ours already: a group ran in this process)
    source = inspect.getsource(launcher)
    assert (
        "from select import select" in source and "select(" in source and callable(launcher.select)
    ), (
        f"{installed()}: {LAUNCHER} no longer calls select as a module global; the stdin relay of "
        f"{GROUPS} spins a core per rank again"
    )


def test_the_launcher_waits_on_reads_only_so_its_rank_threads_do_not_spin():
    import types

    launcher = types.SimpleNamespace(select=select)
    wait_on_reads_only(launcher)
    read_end, write_end = os.pipe()
    try:  # a rank's stdin pipe is always writable: unpatched, select returns it at once
        assert select([read_end], [write_end], [], 0.05)[1] == [write_end]
        assert launcher.select([read_end], [write_end], [], 0.05) == ([], [], [])
        os.write(write_end, b"x")  # what is there to read still comes back
        assert launcher.select([read_end], [write_end], [], 0.05) == ([read_end], [], [])
    finally:
        os.close(read_end)
        os.close(write_end)
