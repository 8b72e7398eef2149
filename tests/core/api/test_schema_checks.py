"""Schema checks off the event loop, in turns per client (issue 26.2)."""

from __future__ import annotations

import asyncio
import threading

from core.api.schema_checks import SchemaChecks
from core.engine import namespaces


def test_checks_run_on_threads_and_one_client_queues_behind_itself():
    """With one turn per client, client A's second check waits for its first; client B's
    runs meanwhile. A cache salt does not make another client."""
    checks = SchemaChecks(threads=4, per_client=1)
    a = namespaces.for_key("key-a")
    a_salted = namespaces.with_salt(a, "pepper")
    b = namespaces.for_key("key-b")
    release_first = threading.Event()
    started: list[str] = []
    loop_thread = threading.get_ident()

    def check(name: str, wait: threading.Event | None = None) -> str:
        assert threading.get_ident() != loop_thread  # never on the event loop
        started.append(name)
        if wait is not None:
            assert wait.wait(10)
        return name

    async def scenario():
        first = asyncio.create_task(checks.run(a, check, "a1", release_first))
        while "a1" not in started:
            await asyncio.sleep(0.01)
        second = asyncio.create_task(checks.run(a_salted, check, "a2"))
        assert await checks.run(b, check, "b1") == "b1"  # B is not behind A
        assert "a2" not in started  # A's second waits for A's first
        release_first.set()
        assert [await first, await second] == ["a1", "a2"]

    try:
        asyncio.run(scenario())
    finally:
        release_first.set()
        checks.close()
    assert started == ["a1", "b1", "a2"]
