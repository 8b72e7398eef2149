"""A thread's CPU priority: background work (the disk tier's writer) that should take the
cores only when the engine leaves them."""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)


def lower_thread_priority(niceness: int) -> bool:
    """Give the calling thread (only it) the CPU priority ``niceness``, never a higher one
    than it has. Linux schedules each thread as a task of its own, so ``setpriority`` on
    the thread's native id does that; elsewhere it applies to the whole process, so
    nothing is done (False)."""
    if not sys.platform.startswith("linux"):
        return False
    me = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, me) < niceness:
            os.setpriority(os.PRIO_PROCESS, me, niceness)
    except OSError as exc:  # a sandbox that refuses it: the writer runs as it did
        log.info("a background thread keeps its CPU priority: %s", exc)
        return False
    return True
