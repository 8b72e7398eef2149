"""Print an OPENBLAS_CORETYPE of another kernel family than this machine's own, for CI's
second run of the numerics tests (issue 27): a test that only holds with one family's
GEMM kernels (their sums in one order) fails in CI, not on a user's machine.

It asks the OpenBLAS that core/cpu_setup.py loads which kernels it picked, and names a
family this CPU can also run whose kernels sum in another order: the AVX2 ones (Haswell)
on an AVX-512 machine, the SSE3 ones (Prescott) on an AVX2 or AVX one, AVX2 or Core2
on an SSE one, the generic ARMv8 ones on other ARM cores. Prints nothing where there is
no OpenBLAS (or no other family)."""

from __future__ import annotations

import ctypes
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

AVX512 = {"skylakex", "cooperlake", "sapphirerapids", "zen4", "zen5"}
AVX2 = {
    "haswell",
    "zen",
    "skylake",
    "broadwell",
    "excavator",
    "steamroller",
    "zen2",
    "zen3",
    "alderlake",
}
AVX = {"sandybridge", "bulldozer", "piledriver"}


def own_core(path: str) -> str:
    library = ctypes.CDLL(path)
    library.openblas_get_corename.restype = ctypes.c_char_p
    return library.openblas_get_corename().decode().strip().lower()


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return {
                flag
                for line in f
                if line.startswith(("flags", "Features"))
                for flag in line.split(":")[1].split()
            }
    except OSError:
        return set()


def other_family(own: str, flags: set[str]) -> str | None:
    if platform.machine() in ("aarch64", "arm64"):
        return None if own == "armv8" else "ARMV8"
    if own in AVX512:
        return "Haswell"
    if own in AVX2 or own in AVX:
        return "Prescott"
    return "Haswell" if "avx2" in flags else "Core2" if own != "core2" else "Prescott"


def main() -> int:
    os.environ.pop("OPENBLAS_CORETYPE", None)
    from core.cpu_setup import find_openblas  # the library core/cpu_setup.py would load

    path = os.environ.get("RADIXCHAT_OPENBLAS") or find_openblas()
    if not path or path == "0":
        return 0
    family = other_family(own_core(path), cpu_flags())
    if family:
        print(family)
    return 0


if __name__ == "__main__":
    sys.exit(main())
