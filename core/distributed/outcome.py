"""How a group ended, read from what its processes print.

MLX's launcher (``mlx.launch``) returns nothing: it exits 0 whatever became of the ranks,
and only logs each rank's end (``Node with rank 1 exited with code 3``). ``radixchat serve
--hosts`` reads the launcher's stderr line by line (passing every line on) into a
:class:`GroupOutcome`, which keeps the first fault a rank reported (the rank and host it
names) and every rank that ended badly; after the launcher exits, :meth:`verdict` says in
one line why the group ended on a fault, or None when it stopped cleanly.

A rank's fault line can be lost: once a rank has ended badly, MLX's launcher writes out
what its ranks printed so far and stops relaying, so a line rank 0 prints a moment later
never arrives. The launcher's own log of each rank's end comes through (it writes it
directly), so the verdict then names the rank that ended badly and how.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

# a rank's fault line: "radixchat: MESSAGE; stopping the group"
FAULT_SUFFIX = "; stopping the group"
ENDED_PREFIX = "radixchat: the group ended on a fault: "  # serve --hosts's last line after a fault
_FAULT = re.compile(r"^radixchat: (.+)" + re.escape(FAULT_SUFFIX) + r"\s*$")
_RANK_END = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|(was killed))")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(line: str) -> str:
    """``line`` without terminal colour codes (MLX's launcher colours its warnings)."""
    return _ANSI.sub("", line)


def fault_line(message: str) -> str:
    """The line a rank prints when it sees the group break."""
    return f"radixchat: {message}{FAULT_SUFFIX}"


def fault_of(line: str) -> str | None:
    """The fault a rank's line reports (the message naming the rank and host), else None."""
    match = _FAULT.match(_ANSI.sub("", line).strip())
    return match.group(1) if match else None


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class GroupOutcome:
    """What the lines of a group's run said; ``hosts`` names each rank's host."""

    hosts: list[str]
    fault: str | None = None  # the first fault a rank reported
    ends: dict[int, str] = field(default_factory=dict)  # rank -> how it ended badly, in order seen

    def read(self, line: str) -> str | None:
        """Take one line of output; the fault it reports if it is the first, else None."""
        fault = fault_of(line)
        if fault is not None and self.fault is None:
            self.fault = fault
            return fault
        end = _RANK_END.search(_ANSI.sub("", line))
        if end is not None:
            rank = int(end.group(1))
            code = int(end.group(2)) if end.group(2) is not None else None
            if code != 0:
                self.ends.setdefault(
                    rank, "was stopped by the launcher" if code is None else _how(code)
                )
        return None

    def verdict(self, launcher_code: int = 0) -> str | None:
        """Why the group ended on a fault (one line), or None when it stopped cleanly."""
        if self.fault is not None:
            return self.fault
        for rank, how in self.ends.items():  # the first to end badly is the likeliest cause
            host = self.hosts[rank] if rank < len(self.hosts) else "?"
            return f"rank {rank} ({host}) {how}"
        if launcher_code:
            return f"the launcher (mlx.launch) {_how(launcher_code)}"
        return None
