"""Giving a dropped model's memory back, on the engine thread.

A model switch drops the old model before the new one loads. Its arrays go once nothing
refers to them (``gc.collect`` for any cycle left), MLX's buffer cache lets their memory go
(``mx.clear_cache``), and on glibc ``malloc_trim`` hands the freed heap back to the system,
so the process's RSS after any number of switches is what one load of the current model
takes (measured: docs/benchmarks.md, ``radixchat bench switch``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from functools import cache

import mlx.core as mx


@cache
def _libc_trim():
    """glibc's ``malloc_trim`` (None elsewhere: macOS's allocator gives pages back itself)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)


def give_memory_back() -> None:
    """Free what nothing refers to any more, and hand it back to the system.

    Where automatic collection is off, the process's GUI thread collects (app.bridge: a
    collection here could finalize the window's Qt objects on this thread, and Qt's
    destructor, holding Qt's signal lock, waits for the GIL the GUI thread holds while it
    waits for that lock: the window hung), so this thread leaves cycles to it."""
    if gc.isenabled():
        gc.collect()
    mx.clear_cache()
    trim = _libc_trim()
    if trim is not None:
        trim(0)
