"""Stopping a group's processes: SIGINT first, harder when they have not ended, and the
lifeline that tells a launcher its command is gone (on stand-in processes: no MLX)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from core.distributed.stop import GroupStopper, watch_lifeline

# a stand-in for a group's process: it ignores the signals it is given, says so, then waits
IGNORING = (
    "import signal, sys, time\n"
    "for name in sys.argv[1:]: signal.signal(getattr(signal, name), signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


def stand_in(*ignored: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", IGNORING, *ignored],
        stdout=subprocess.PIPE,
        start_new_session=True,
        text=True,
    )
    assert process.stdout.readline() == "ready\n"
    return process


def ended_by(process: subprocess.Popen) -> signal.Signals:
    code = process.wait(30)
    process.stdout.close()
    return signal.Signals(-code)


def test_sigint_first_then_sigterm_then_sigkill():
    obeys = stand_in()
    GroupStopper(obeys.pid, stop_s=0.2, kill_s=0.2).stop()
    assert ended_by(obeys) == signal.SIGINT  # as Ctrl-C: what a group's rank 0 acts on
    deaf_to_int = stand_in("SIGINT")
    GroupStopper(deaf_to_int.pid, stop_s=0.2, kill_s=0.2).stop()
    assert ended_by(deaf_to_int) == signal.SIGTERM
    deaf = stand_in("SIGINT", "SIGTERM")
    GroupStopper(deaf.pid, stop_s=0.2, kill_s=0.2).stop()
    assert ended_by(deaf) == signal.SIGKILL


def test_a_second_stop_goes_one_step_further_at_once_and_close_stops_the_timers():
    deaf = stand_in("SIGINT", "SIGTERM")
    stopper = GroupStopper(deaf.pid, stop_s=600, kill_s=600)
    stopper.stop()
    assert stopper.stopping and deaf.poll() is None
    stopper.stop()  # SIGTERM, ignored
    assert deaf.poll() is None
    stopper.stop()
    assert ended_by(deaf) == signal.SIGKILL
    stopper.stop()  # nothing left to send, and the group is gone: no error
    waiting = stand_in("SIGINT")
    closed = GroupStopper(waiting.pid, stop_s=0.1, kill_s=0.1)
    closed.stop()
    closed.close()  # the group ended as far as its owner knows: no SIGTERM follows
    with pytest.raises(subprocess.TimeoutExpired):
        waiting.wait(1.0)  # well past stop_s
    waiting.kill()
    assert ended_by(waiting) == signal.SIGKILL


def test_the_lifeline_reports_its_writer_gone():
    read, write = os.pipe()
    gone = threading.Event()
    thread = watch_lifeline(read, gone.set)
    assert not gone.wait(0.2)
    os.close(write)
    assert gone.wait(10)
    thread.join(10)
