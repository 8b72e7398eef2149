"""Stopping a group: whoever stops ``radixchat serve --hosts`` stops every process of it.

The command runs MLX's launcher in a process group of its own (the launcher starts the
ranks on this machine in that group, and an ``ssh`` per other host). The command's own
stop signals (SIGINT: Ctrl-C or ``kill -INT``; SIGTERM: a service manager; SIGHUP: its
terminal closed) are not left to reach the group by chance: each one goes to the
launcher's group through a :class:`GroupStopper`, which stops it as Ctrl-C always did,
with SIGINT, which only rank 0 acts on (it stops every rank in order, each flushing its
disk cache; the launcher and the other ranks ignore it). A group that has not ended
``STOP_S`` later gets SIGTERM, and SIGKILL ``KILL_S`` after that; a second stop signal
goes one step further at once.

The command can also die without a word (SIGKILL, a crash). It holds the write end of a
pipe, the *lifeline*, whose read end the launcher watches (:func:`watch_lifeline`): when
the command is gone the pipe reads end-of-file, and the launcher stops its own group the
same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

STOP_S = 60.0  # after SIGINT: rank 0 flushes every rank's disk cache; then SIGTERM
KILL_S = 10.0  # after SIGTERM: then SIGKILL
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
LIFELINE_ENV = "RADIXCHAT_GROUP_LIFELINE"  # the launcher's end of the lifeline (a file descriptor)


class GroupStopper:
    """Stops the process group ``pgid``: SIGINT, then SIGTERM after ``stop_s``, then
    SIGKILL after ``kill_s``; :meth:`stop` again goes one step further at once."""

    STEPS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)

    def __init__(self, pgid: int, stop_s: float = STOP_S, kill_s: float = KILL_S):
        self.pgid = pgid
        self._waits = (stop_s, kill_s)
        self._step = 0  # the next signal to send, as an index of STEPS
        self._lock = threading.RLock()  # a signal handler may call stop() while the timer does
        self._timer: threading.Timer | None = None
        self._closed = False

    @property
    def stopping(self) -> bool:
        return self._step > 0

    def stop(self, *_signal_handler_args) -> None:
        """Send the next signal now (first SIGINT), and arm the one after it."""
        with self._lock:
            if self._closed or self._step >= len(self.STEPS):
                return
            signum, self._step = self.STEPS[self._step], self._step + 1
            if self._timer is not None:
                self._timer.cancel()
            try:
                os.killpg(self.pgid, signum)
            except (ProcessLookupError, PermissionError):
                return  # the group has ended
            if self._step < len(self.STEPS):
                self._timer = threading.Timer(
                    self._waits[self._step - 1], self._timed, (self._step,)
                )
                self._timer.daemon = True
                self._timer.start()

    def _timed(self, step: int) -> None:
        with self._lock:
            if self._step == step:  # no stop() since this timer was armed
                self.stop()

    def close(self) -> None:
        """The group has ended: nothing more is sent."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()


def on_stop_signals(handler) -> dict[int, object]:
    """Route the command's stop signals to ``handler``; the previous handlers, for
    :func:`restore_signals`. Only the main thread may set handlers: elsewhere nothing is set."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}


def restore_signals(previous: dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def watch_lifeline(fd: int, on_gone) -> threading.Thread:
    """Call ``on_gone()`` once the pipe ``fd`` reads end-of-file (its writer, the command
    that started this process, has ended, however it ended). Nothing is ever written to it."""

    def watch() -> None:
        try:
            with contextlib.suppress(OSError):  # a read error ends the watch as end-of-file does
                while os.read(fd, 64):
                    continue
        finally:
            os.close(fd)
        on_gone()

    thread = threading.Thread(target=watch, name="radixchat-group-lifeline", daemon=True)
    thread.start()
    return thread
