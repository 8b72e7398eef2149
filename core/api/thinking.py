"""A reasoning model's reply taken apart: its thought (between the model's markers, such as
``<think>`` and ``</think>``) and its answer, as the text streams in.

The thought is the text after the opening marker (which may only be preceded by white
space; a template that writes the opening marker itself starts the reply inside the
thought) up to the closing one; the white space that follows the closing marker is not
part of the answer. A marker split across two pieces of the stream is held back until the
next piece says what it is, so neither part ever shows a piece of a marker.
"""

from __future__ import annotations

from dataclasses import dataclass

BEFORE, INSIDE, AFTER = "before", "inside", "after"


@dataclass(frozen=True)
class Parts:
    """What may be sent now: a piece of the thought, a piece of the answer."""

    thinking: str = ""
    content: str = ""


class ThoughtSplitter:
    """Feed the reply's text in order; each call returns what may be sent now."""

    def __init__(self, start: str, end: str, inside: bool = False):
        self.start, self.end = start, end
        self.state = INSIDE if inside else BEFORE
        self._pending = ""
        self._answer_started = False  # the white space after the thought is dropped until then

    def feed(self, text: str) -> Parts:
        self._pending += text
        thinking: list[str] = []
        content: list[str] = []
        while self._pending:
            if self.state == BEFORE:
                stripped = self._pending.lstrip()
                if stripped.startswith(self.start):
                    self._pending = stripped[len(self.start) :]
                    self.state = INSIDE
                elif not stripped or self.start.startswith(stripped):
                    break  # white space, or a piece of the opening marker: wait for more
                else:
                    self.state = AFTER  # no thought: it is all answer
                    self._answer_started = True
            elif self.state == INSIDE:
                at = self._pending.find(self.end)
                if at >= 0:
                    thinking.append(self._pending[:at])
                    self._pending = self._pending[at + len(self.end) :]
                    self.state = AFTER
                else:
                    keep = _partial_suffix(self._pending, self.end)
                    thinking.append(self._pending[: len(self._pending) - keep])
                    self._pending = self._pending[len(self._pending) - keep :]
                    break
            else:
                text, self._pending = self._pending, ""
                if not self._answer_started:
                    text = text.lstrip()
                    self._answer_started = bool(text)
                content.append(text)
        return Parts("".join(thinking), "".join(content))

    def finish(self) -> Parts:
        """The reply ended: what was held back (an unfinished thought stays a thought)."""
        held, self._pending = self._pending, ""
        if self.state == INSIDE:
            return Parts(thinking=held)
        if self.state == BEFORE:
            return Parts(content=held.strip() and held)
        return Parts(content=held if self._answer_started else held.lstrip())


def split_whole(text: str, start: str, end: str, inside: bool = False) -> Parts:
    """A whole reply taken apart."""
    splitter = ThoughtSplitter(start, end, inside)
    first, last = splitter.feed(text), splitter.finish()
    return Parts(first.thinking + last.thinking, first.content + last.content)


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker`` (held back)."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
