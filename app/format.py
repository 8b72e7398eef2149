"""Numbers as the panels show them: bytes, percentages, token counts, durations.

Pure functions of plain values (no Qt), so any widget can share them and tests can
check them without a display.
"""

from __future__ import annotations

import math

_BYTE_UNITS = ("B", "KB", "MB", "GB", "TB")  # each 1024 of the one before: core.paths.GB is 2**30


def human_bytes(n: float | None) -> str:
    """Binary multiples with the short names memory tools use: 1536 -> "1.5 KB",
    3 * 2**30 -> "3.0 GB"; at most three digits before the point ("999 MB", then "1.0 GB")."""
    return _in_units(n, 1024)


def _in_units(n: float | None, step: int) -> str:
    """``n`` bytes in multiples of ``step`` (1024 or 1000), at most three digits before the
    point."""
    value = float(n or 0)
    sign, value = ("-" if value < 0 else ""), abs(value)
    unit = _BYTE_UNITS[0]
    for unit in _BYTE_UNITS:
        if value < 999.5 or unit == _BYTE_UNITS[-1]:
            break
        value /= step
    if unit == "B":
        return f"{sign}{value:.0f} B"
    return f"{sign}{value:.{1 if value < 99.95 else 0}f} {unit}"


FILE_UNITS_NOTE = "file and download sizes: MB = 1,000,000 bytes, as pip and browsers count"


def file_bytes(n: float | None) -> str:
    """A file's or a download's size in decimal multiples (1 MB = 10^6 bytes, as pip, the
    hub and browsers show them: the same file reads the same everywhere): 98_300_000 ->
    "98.3 MB". Memory stays in ``human_bytes``'s binary multiples."""
    return _in_units(n, 1000)


def percent(fraction: float | None, digits: int = 0) -> str:
    """0.423 -> "42%". A non-zero share never reads "0%" and a partial one never "100%"."""
    value = 100 * float(fraction or 0)
    text = f"{value:.{digits}f}%"
    smallest = 10**-digits
    if 0 < value < smallest / 2:
        return f"<{smallest:g}%"
    if 100 - smallest / 2 <= value < 100:
        return f">{100 - smallest:g}%"
    return text


def count(n: float | None) -> str:
    """A whole number with thousands separators: 12345 -> "12,345"."""
    return f"{int(n or 0):,}"


def duration(seconds: float | None) -> str:
    """A short duration: 0.0421 -> "42 ms", 1.234 -> "1.23 s", 12.34 -> "12.3 s",
    75 -> "1 min 15 s"."""
    s = max(0.0, float(seconds or 0))
    if s < 0.9995:
        return f"{s * 1000:.0f} ms"
    if s < 9.995:
        return f"{s:.2f} s"
    if s < 59.95:
        return f"{s:.1f} s"
    minutes, rest = divmod(round(s), 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


def nice_step(span: float, intervals: int = 4) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that splits ``span`` into at most
    ``intervals`` steps: an axis from 0 to ``intervals * nice_step(top)`` covers ``top``
    with round tick labels."""
    raw = span / intervals if span > 0 else 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for mantissa in (1, 2, 2.5, 5, 10):
        if mantissa * power >= raw * (1 - 1e-9):
            return mantissa * power
    return 10 * power  # not reached


def decimals_for(step: float) -> int:
    """How many decimals tick labels need to show multiples of ``step`` exactly (at most 3)."""
    for digits in range(4):
        if abs(round(step, digits) - step) < 1e-9 * max(1.0, abs(step)):
            return digits
    return 3
