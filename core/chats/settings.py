"""A chat's sampling settings (the store's ``settings``): which they are
(:data:`SAMPLING_KEYS`, the one list the window, ``radixchat chat`` and a chat's export
use), the range and label of each, checked where settings come in from outside (an
imported chat: a value out of its range, of the wrong type, NaN or infinite is refused by
name) and made usable where they are read back (a value stored before it was checked, or
edited by hand: clamped into its range, or left out for the default, never an exception
in the dialog that shows it).

The ranges are the Chat Settings dialog's (``app/chat_settings.py`` builds its boxes from
them) and fit what :class:`core.engine.types.SamplingParams` accepts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.engine.types import SamplingParams
from core.errors import UserError


@dataclass(frozen=True)
class Range:
    """The values one setting takes: ``low`` to ``high``, whole numbers if ``whole``; None
    too if ``optional`` (the seed: None is random). ``label``: the setting in a sentence."""

    low: float
    high: float
    whole: bool = False
    optional: bool = False
    label: str = ""

    def describe(self) -> str:
        kind = "a whole number" if self.whole else "a number"
        low, high = (int(self.low), int(self.high)) if self.whole else (self.low, self.high)
        return f"{kind} from {low} to {high}" + (" or null" if self.optional else "")


RANGES = {
    "temperature": Range(0.0, 2.0, label="temperature"),
    "top_p": Range(0.01, 1.0, label="top-p"),
    "top_k": Range(0, 1000, whole=True, label="top-k"),
    "min_p": Range(0.0, 1.0, label="min-p"),
    "repetition_penalty": Range(1.0, 2.0, label="repetition penalty"),
    "max_tokens": Range(1, 32768, whole=True, label="max tokens"),
    "seed": Range(0, 2**31 - 1, whole=True, optional=True, label="seed"),
}
# A chat's sampling settings, in the Chat Settings dialog's order: what its boxes edit, a
# preset keeps, and a reply records it was made with (the window's and ``radixchat chat``'s)
SAMPLING_KEYS = tuple(RANGES)
MAX_STOP = 16  # stop strings a chat keeps
MAX_STOP_CHARS = 1000


def checked(settings: object, where: str = "settings") -> dict:
    """``settings`` from outside, each known key checked against its range (a UserError
    naming the key for anything else); keys this version does not know are left out."""
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise UserError(f"{where} is not an object of sampling settings")
    out: dict = {}
    for key, value in settings.items():
        if key == "stop":
            out[key] = _checked_stop(value, f"{where}.stop")
        elif key in RANGES:
            number = _in_range(value, RANGES[key])
            if number is _BAD:
                raise UserError(
                    f"{where}.{key} must be {RANGES[key].describe()}, not {short_repr(value)}"
                )
            out[key] = number
    return out


def usable(settings: object) -> dict:
    """Stored ``settings`` as the window and the engine can use them: each known value of
    the right type clamped into its range; one that is not a finite number of the right
    kind (NaN, infinite, text) left out, so its default applies. Other keys kept."""
    if not isinstance(settings, dict):
        return {}
    out = {}
    for key, value in settings.items():
        if key in RANGES:
            number = _clamped(value, RANGES[key])
            if number is not _BAD:
                out[key] = number
        elif key == "stop":
            try:
                out[key] = _checked_stop(value, "stop")
            except UserError:
                continue
        else:
            out[key] = value
    return out


def sampling_settings(sampling: SamplingParams) -> dict:
    """``sampling``'s values of :data:`SAMPLING_KEYS`: a chat's settings (the engine's
    defaults, for ``SamplingParams()``), or what a reply was made with."""
    return {key: getattr(sampling, key) for key in SAMPLING_KEYS}


_BAD = object()


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _in_range(value: object, limits: Range):
    """``value`` if it lies in ``limits`` (an integral float as an int where whole numbers
    are asked for), else _BAD."""
    if value is None:
        return None if limits.optional else _BAD
    if not _is_number(value) or not math.isfinite(value):
        return _BAD
    if limits.whole:
        if value != int(value):
            return _BAD
        value = int(value)
    return value if limits.low <= value <= limits.high else _BAD


def _clamped(value: object, limits: Range):
    if value is None:
        return None if limits.optional else _BAD
    if not _is_number(value) or not math.isfinite(value):
        return _BAD
    value = min(max(value, limits.low), limits.high)
    return int(round(value)) if limits.whole else float(value)


def _checked_stop(value: object, where: str) -> list[str]:
    if value is None:
        return []
    if (
        not isinstance(value, list)
        or len(value) > MAX_STOP
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in value)
    ):
        raise UserError(
            f"{where} must be a list of at most {MAX_STOP} strings "
            f"(each 1 to {MAX_STOP_CHARS} characters)"
        )
    return list(value)


def short_repr(value: object) -> str:
    """``value`` as an error line shows it: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
