"""A chat's sampling settings: checked into their ranges where they come in (an import),
made usable where they are read back (a value stored before the checks, or by hand)."""

from __future__ import annotations

import pytest

from core.chats import settings
from core.engine.types import SamplingParams
from core.errors import UserError

GOOD = {
    "temperature": 0.3,
    "top_p": 0.9,
    "top_k": 40,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "max_tokens": 256,
    "seed": 7,
}


def test_the_sampling_keys_are_the_engines_and_each_has_its_range_and_label():
    """One list of a chat's sampling keys (the window's, the CLI's, the export's): each a
    field of SamplingParams with a range and a label; a turn records exactly those."""
    assert settings.SAMPLING_KEYS == tuple(GOOD)
    assert all(settings.RANGES[key].label for key in settings.SAMPLING_KEYS)
    assert settings.sampling_settings(SamplingParams(**GOOD)) == GOOD


def test_settings_in_range_pass_as_they_are_and_fit_the_engine():
    assert settings.checked(GOOD) == GOOD
    assert settings.checked(None) == {}
    SamplingParams(**settings.checked(GOOD))  # what passes, the engine takes
    for key, limits in settings.RANGES.items():  # both ends of every range
        for end in (limits.low, limits.high):
            SamplingParams(**settings.checked({key: end}))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("temperature", float("nan")),
        ("temperature", -0.1),
        ("temperature", "0.5"),
        ("max_tokens", float("inf")),
        ("max_tokens", 0),
        ("max_tokens", 10.5),
        ("top_k", "5"),
        ("top_k", True),
        ("top_p", 0),
        ("seed", -1),
        ("seed", 2**31),
        ("min_p", None),
    ],
)
def test_a_value_out_of_its_range_is_refused_by_name(key, value):
    with pytest.raises(UserError, match=f"settings.{key} must be") as raised:
        settings.checked({key: value})
    assert "\n" not in str(raised.value)


def test_stored_values_read_back_usable():
    """NaN, infinities and text (stored before the checks): the default (left out); a
    number out of range: clamped; other keys kept."""
    stored = {
        "temperature": float("nan"),
        "max_tokens": float("inf"),
        "top_k": "5",
        "top_p": 7,
        "seed": 1e30,
        "min_p": -1,
        "stop": "no",
        "colour": "red",
    }
    usable = settings.usable(stored)
    assert usable == {"top_p": 1.0, "seed": 2**31 - 1, "min_p": 0.0, "colour": "red"}
    assert settings.usable("junk") == {} and settings.usable(GOOD) == GOOD
    SamplingParams(**{k: v for k, v in usable.items() if k in settings.RANGES})
