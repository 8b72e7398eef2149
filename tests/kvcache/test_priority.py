"""A thread's CPU priority is lowered for that thread only, and never raised."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from kvcache.priority import lower_thread_priority


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads' priorities: Linux")
def test_lowering_a_threads_priority_never_raises_it():
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = []

    def run(first: int, then: int) -> None:
        seen.append(lower_thread_priority(first))
        seen.append(lower_thread_priority(then))  # lower than before: kept at first
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    thread = threading.Thread(target=run, args=(19, 18))
    thread.start()
    thread.join()
    assert seen == [True, True, 19]
    # the thread that asked for it only
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
