"""Plain helpers of the API's tests (their fixtures are in conftest.py)."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 120.0) -> bool:
    """Whether ``predicate()`` came true within ``timeout`` seconds (polled: what it reads
    is the server's, published by another thread)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False
