"""Where a request's schemas are checked: never on the event loop.

:class:`SchemaChecks` runs the checks (:func:`core.api.openai_schema.to_call` and its
Anthropic twins, for bodies with tools or a response format) on a few threads of their
own, and at most ``PER_CLIENT`` requests of one client (API key, whatever its cache salts)
at a time: a client that sends many heavy bodies queues behind itself, not in front of
the others. jsonschema is pure Python: a check thread shares the interpreter with the
event loop, which still gets its turns (a C call would hold it; a Python loop does not).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from core.engine import namespaces

CHECK_THREADS = 4
PER_CLIENT = 2  # one client's requests whose schemas are being checked at once

T = TypeVar("T")


@dataclass
class _ClientTurns:
    slots: asyncio.Semaphore
    requests: int = 0  # waiting or being checked


class SchemaChecks:
    """Runs a request's checks off the event loop: ``CHECK_THREADS`` threads for every
    client, at most ``PER_CLIENT`` requests of one client (API key) at a time."""

    def __init__(self, threads: int = CHECK_THREADS, per_client: int = PER_CLIENT):
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="radixchat-schemas")
        self._per_client = per_client
        self._clients: dict[str, _ClientTurns] = {}  # clients with a request here now

    async def run(self, namespace: str, check: Callable[..., T], *args, **kwargs) -> T:
        """``check(*args, **kwargs)`` on a check thread, in the turn of ``namespace``'s client."""
        client = namespaces.owner(namespace)
        turns = self._clients.get(client)
        if turns is None:
            turns = self._clients[client] = _ClientTurns(asyncio.Semaphore(self._per_client))
        turns.requests += 1
        try:
            async with turns.slots:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(
                    self._pool, functools.partial(check, *args, **kwargs)
                )
        finally:
            turns.requests -= 1
            if not turns.requests:
                del self._clients[client]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
