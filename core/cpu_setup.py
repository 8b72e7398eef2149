"""Make MLX's CPU backend fast on Linux.

The ``mlx-cpu`` wheel ships a reference BLAS. Loading the system's OpenBLAS with
``RTLD_GLOBAL`` before the first ``import mlx`` makes MLX's GEMM calls resolve to it,
many times faster (measured: docs/benchmarks.md).
``core/__init__`` arranges for this to run right before the first ``import mlx`` in the
process (:func:`prepare_before_mlx`), whoever imports it: a command that never touches
MLX (``radixchat pull``, ``search``) does not pay for loading OpenBLAS and starting its
threads.

``RADIXCHAT_OPENBLAS=0`` turns it off; ``RADIXCHAT_OPENBLAS=/path/libopenblas.so.0``
names the library. On macOS nothing is done: MLX uses Accelerate and Metal.

OpenBLAS's worker threads busy-wait for 2^28 cycles (about 0.1 s) after every call
before they sleep, so after each request they kept the other core busy for nothing and
slowed a disk restore that followed. ``OPENBLAS_THREAD_TIMEOUT`` (2^n cycles) is set to 16
unless the user set it, at no cost to prefill or decode (measured: docs/benchmarks.md).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
THREAD_TIMEOUT = "16"  # OpenBLAS workers spin 2^16 cycles (~25 us) before sleeping


@dataclass(frozen=True)
class BlasSetup:
    """What :func:`prepare_cpu_backend` did, for diagnostics and the benchmarks."""

    library: str | None
    reason: str


_SETUP: BlasSetup | None = None


def find_openblas() -> str | None:
    """The system OpenBLAS this module loads when asked to find one, or None."""
    import ctypes.util

    for candidate in _CANDIDATES:
        if Path(candidate).exists():
            return candidate
    return ctypes.util.find_library("openblas")


def prepare_cpu_backend() -> BlasSetup:
    """Load the system OpenBLAS before mlx, once. Safe to call many times."""
    global _SETUP
    if _SETUP is not None:
        return _SETUP
    wanted = os.environ.get("RADIXCHAT_OPENBLAS", "auto")
    if not sys.platform.startswith("linux"):
        _SETUP = BlasSetup(None, "not Linux: MLX uses Accelerate/Metal")
    elif wanted == "0":
        _SETUP = BlasSetup(None, "disabled by RADIXCHAT_OPENBLAS=0")
    elif "mlx.core" in sys.modules:
        _SETUP = BlasSetup(None, "mlx was imported first; OpenBLAS not loaded")
    else:
        path = wanted if wanted not in ("auto", "1", "") else find_openblas()
        if path is None:
            _SETUP = BlasSetup(None, "system OpenBLAS not found (apt install libopenblas0-pthread)")
        else:
            import ctypes

            os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", THREAD_TIMEOUT)  # read when loaded
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                _SETUP = BlasSetup(path, "system OpenBLAS loaded before mlx")
            except OSError as exc:
                _SETUP = BlasSetup(None, f"could not load {path}: {exc}")
    return _SETUP


def blas_setup() -> BlasSetup:
    return prepare_cpu_backend()


class _BeforeMlx:
    """An import hook (first on ``sys.meta_path``) that runs :func:`prepare_cpu_backend`
    when ``mlx`` is about to be imported, then steps aside: it finds nothing itself, so
    the import goes on as usual."""

    def find_spec(self, name, path=None, target=None):
        if name == "mlx" or name.startswith("mlx."):
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            prepare_cpu_backend()
        return None


def prepare_before_mlx() -> None:
    """Have :func:`prepare_cpu_backend` run right before the process first imports mlx (at
    once if it has already: then it only records that it came too late)."""
    if "mlx" in sys.modules:
        prepare_cpu_backend()
    elif _SETUP is None and not any(isinstance(f, _BeforeMlx) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeMlx())
