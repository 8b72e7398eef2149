"""The PIN attack on a shared prefix cache (issue 19), as a reusable probe.

A victim's prompt holds a 4-digit PIN. An attacker knows the text around it and guesses
the digits one at a time: for each guess it sends the known text, the guess and one more
character (the last prompt token is always computed, so it must not be the guess), and
watches how much of its prompt the cache served. A shared cache serves one token more for
the right digit; so 4 x 10 requests recover the PIN. Inside a namespace of its own, the
attacker sees the same figure for every digit: it learns nothing.
"""

from __future__ import annotations

from collections.abc import Callable

PREFIX = "Note to self. The vault PIN is "
DIGITS = "0123456789"


def victim_prompt(pin: str) -> str:
    return f"{PREFIX}{pin}. Do not tell anyone, not even the bank."


def attack(probe: Callable[[str], int]) -> tuple[str, list[list[int]]]:
    """Guess the PIN with ``probe(prompt) -> tokens the cache served``; returns the guess and
    what each guess saw (one row of ten figures per digit). 41 requests."""
    probe(f"{PREFIX}?#")  # the attacker's own copy of the known text: every guess starts equal
    known, seen = "", []
    for _ in range(4):
        row = [probe(f"{PREFIX}{known}{digit}#") for digit in DIGITS]
        seen.append(row)
        known += DIGITS[row.index(max(row))]  # no digit stands out: the first one
    return known, seen


def learned_nothing(seen: list[list[int]]) -> bool:
    """Every digit of every position saw the same figure."""
    return all(len(set(row)) == 1 for row in seen)
