"""The MCP servers of a running app: :class:`McpHub` holds a session open to each.

The hub runs an asyncio event loop on its own daemon thread. Each enabled server gets one
long-lived task there that holds an ``mcp.ClientSession`` open: over a child process's
stdin and stdout (``core.mcp.child``; env = this process's plus the server's, its stderr
appended to ``<data>/logs/mcp-NAME.log``) or over streamable HTTP (URL and headers). When
a child exits the server shows "failed" with the reason and is started again after a
backoff (1 s, 2 s, 4 s … at most 30 s; reset once a run lasted that long). A server that
does not start, or answers badly, is "failed" with one line and blocks nothing: every
step has a timeout.

Other threads (the GUI, a chat turn) call the hub's plain-value methods; none of them
waits on a server except :meth:`ToolCallHandle.result`, which the caller bounds::

    hub = McpHub(root, load_servers(root)); hub.start()
    table = hub.tools({"files": None})            # OpenAI tool specs and their routes
    handle = hub.call("files", "list_directory", {"path": "/tmp"}, timeout_s=60)
    handle.add_done_callback(lambda h: ...)        # on the hub's thread
    result = handle.result(timeout=65)             # ToolResult; handle.cancel() stops it
    hub.stop()                                     # sessions closed, children ended
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio

from core import paths
from core.mcp.child import Child, child_transport
from core.mcp.config import McpServer, resolved_env, resolved_headers
from core.mcp.tools import (
    ServerStatus,
    ToolInfo,
    ToolResult,
    ToolTable,
    error_line,
    failed,
    openai_tools,
    tool_info,
    tool_result,
)

log = logging.getLogger(__name__)
START_TIMEOUT_S = 30.0  # to start, initialize and list the tools
STOP_TIMEOUT_S = 10.0
_LOG_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(eq=False)
class _Slot:
    """One configured server, on the loop's thread (its plain values under the hub's lock)."""

    config: McpServer
    status: ServerStatus
    session: Any = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    scope: anyio.CancelScope | None = None
    task: asyncio.Task | None = None
    stopping: bool = False


class ToolCallHandle:
    """A tool call on its way: :meth:`result` waits for its :class:`ToolResult`,
    :meth:`cancel` stops it (the server is told; hub and server stay usable)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None, server: str, tool: str) -> None:
        self.server, self.tool = server, tool
        self._loop = loop
        self._future: concurrent.futures.Future[ToolResult] = concurrent.futures.Future()
        self._scope: anyio.CancelScope | None = None
        self._cancelled = False

    def result(self, timeout: float | None = None) -> ToolResult:
        """The call's result; raises ``TimeoutError`` when ``timeout`` seconds pass first
        (the call goes on: its own timeout ends it)."""
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            raise TimeoutError(f"{self.server}.{self.tool} has not finished yet") from exc

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> None:
        """Stop the call; its result is an error result "cancelled"."""
        if self._loop is not None and not self._future.done():
            try:
                self._loop.call_soon_threadsafe(self._cancel_on_loop)
            except RuntimeError:  # the loop is closed: the call has its result already
                pass

    def add_done_callback(self, fn: Callable[[ToolCallHandle], None]) -> None:
        """Call ``fn(handle)`` when the call is done: on the hub's thread (or at once, on
        this one, if it is done already)."""
        self._future.add_done_callback(lambda _future: fn(self))

    def _cancel_on_loop(self) -> None:
        self._cancelled = True
        if self._scope is not None:
            self._scope.cancel()

    def attach(self, scope: anyio.CancelScope) -> None:
        """(The hub's, on its loop.) The scope the call runs in, cancelled at once if
        :meth:`cancel` came first."""
        self._scope = scope
        if self._cancelled:
            scope.cancel()

    def settle(self, result: ToolResult) -> None:
        """(The hub's.) The call's result; the first one counts."""
        if not self._future.done():
            self._future.set_result(result)


class McpHub:
    """The MCP servers of ``servers`` (see the module's docstring). ``backoff_s`` is the
    first restart delay and ``backoff_max_s`` the longest (tests make them short)."""

    def __init__(
        self,
        root: Path,
        servers: Iterable[McpServer] = (),
        *,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.root = Path(root)
        self._servers = tuple(servers)
        self._backoff = (backoff_s, backoff_max_s)
        self._start_timeout = start_timeout_s
        self._lock = threading.Lock()
        self._statuses: dict[str, ServerStatus] = {
            s.name: ServerStatus(s.name, "stopped" if s.enabled else "disabled")
            for s in self._servers
        }
        self._slots: dict[str, _Slot] = {}  # the loop's own
        self._calls: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- the other threads' side --

    @property
    def servers(self) -> tuple[McpServer, ...]:
        """The configured servers, in the configuration's order."""
        return self._servers

    @property
    def running(self) -> bool:
        """Started and not stopped since."""
        return self._thread is not None

    def start(self) -> None:
        """Start the loop's thread and every enabled server (returns at once)."""
        if self._thread is not None:
            return
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="mcp-hub", daemon=True)
        self._thread.start()
        started.wait()
        self._submit(self._apply(self._servers)).result()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Close every session and end every child (their process groups too); calls in
        flight end with an error result. The hub can be started again."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            self._submit(self._shutdown()).result(timeout_s)
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            log.warning("MCP servers did not stop in %s s: %s", timeout_s, exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        self._loop = self._thread = None
        with self._lock:
            for name, status in self._statuses.items():
                if status.state != "disabled":
                    self._statuses[name] = replace(status, state="stopped", tools=(), pid=None)

    def reload(self, servers: Iterable[McpServer]) -> None:
        """Apply a changed configuration: start new or enabled servers, stop removed or
        disabled ones, restart those whose settings changed; the rest run on."""
        self._servers = tuple(servers)
        if self._loop is None:
            with self._lock:
                self._statuses = {
                    s.name: self._statuses.get(s.name, ServerStatus(s.name, "stopped"))
                    if s.enabled
                    else ServerStatus(s.name, "disabled")
                    for s in self._servers
                }
            return
        self._submit(self._apply(self._servers)).result(STOP_TIMEOUT_S * 2)

    def statuses(self) -> tuple[ServerStatus, ...]:
        """Every configured server's status, in the configuration's order."""
        with self._lock:
            return tuple(self._statuses[s.name] for s in self._servers if s.name in self._statuses)

    def status(self, name: str) -> ServerStatus | None:
        with self._lock:
            return self._statuses.get(name)

    def tools(self, enabled: Mapping[str, set[str] | None]) -> ToolTable:
        """The ready servers' tools that ``enabled`` chooses (a server's name to None for all
        its tools, or to a set of tool names) as OpenAI tool specs with their routes."""
        infos: list[ToolInfo] = [t for s in self.statuses() if s.state == "ready" for t in s.tools]
        return openai_tools(infos, enabled)

    def log_file(self, name: str) -> Path:
        """Where a stdio server's stderr goes: ``<data>/logs/mcp-NAME.log``."""
        return paths.logs_dir(self.root) / f"mcp-{_LOG_NAME_BAD.sub('_', name)}.log"

    def call(
        self, server: str, tool: str, arguments: dict[str, Any], timeout_s: float = 60.0
    ) -> ToolCallHandle:
        """Call ``tool`` of ``server`` (a server still starting is waited for, within the
        timeout). Returns at once; the handle gives the result."""
        handle = ToolCallHandle(self._loop, server, tool)
        if self._loop is None:
            handle.settle(failed("the MCP servers are not running"))
            return handle
        try:
            self._submit(self._call(handle, server, tool, dict(arguments or {}), timeout_s))
        except RuntimeError:  # the loop closed under us
            handle.settle(failed("the MCP servers are not running"))
        return handle

    def _submit(self, coro) -> concurrent.futures.Future:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the hub is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _publish(self, slot: _Slot, **changes: Any) -> None:
        slot.status = replace(slot.status, **changes)
        with self._lock:
            if self._slots.get(slot.config.name) is slot:
                self._statuses[slot.config.name] = slot.status

    # -- the loop's side --

    async def _apply(self, servers: tuple[McpServer, ...]) -> None:
        wanted = {s.name: s for s in servers}
        stale = [
            slot
            for name, slot in self._slots.items()
            if name not in wanted or wanted[name] != slot.config
        ]
        await self._stop_slots(stale)
        with self._lock:
            self._statuses = {
                name: status for name, status in self._statuses.items() if name in wanted
            }
            for server in servers:
                if not server.enabled:
                    self._statuses[server.name] = ServerStatus(server.name, "disabled")
        for server in servers:
            if server.enabled and server.name not in self._slots:
                previous = self._statuses.get(server.name)
                slot = _Slot(server, ServerStatus(server.name, "starting"))
                if previous is not None:
                    slot.status = replace(slot.status, restarts=previous.restarts)
                self._slots[server.name] = slot
                self._publish(slot)
                slot.task = asyncio.get_running_loop().create_task(self._run(slot))

    async def _stop_slots(self, slots: list[_Slot]) -> None:
        for slot in slots:
            slot.stopping = True
            slot.ready.clear()
            if slot.scope is not None:
                slot.scope.cancel()
            slot.closed.set()  # wakes a backoff wait
        tasks = [slot.task for slot in slots if slot.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
        for slot in slots:
            self._slots.pop(slot.config.name, None)

    async def _shutdown(self) -> None:
        await self._stop_slots(list(self._slots.values()))
        if self._calls:  # calls that were waiting for a server
            for task in self._calls:
                task.cancel()
            await asyncio.wait(self._calls, timeout=STOP_TIMEOUT_S)

    async def _run(self, slot: _Slot) -> None:
        """Hold the server's session open; restart it with backoff when it ends."""
        delay = self._backoff[0]
        while not slot.stopping:
            self._publish(slot, state="starting", error=None, tools=(), pid=None)
            began = time.monotonic()
            try:
                error = await self._serve(slot)
            except Exception as exc:  # noqa: BLE001 (any failure is the server's state)
                error = error_line(exc)
            slot.session = None
            slot.ready.clear()
            if slot.stopping:
                break
            if time.monotonic() - began >= self._backoff[1]:
                delay = self._backoff[0]  # it ran a good while: start again soon
            self._publish(slot, state="failed", error=error, tools=(), pid=None)
            log.warning("MCP server %s failed: %s", slot.config.name, error)
            slot.closed.clear()
            try:
                await asyncio.wait_for(slot.closed.wait(), delay)
            except TimeoutError:
                pass
            delay = min(delay * 2, self._backoff[1])
            if not slot.stopping:
                self._publish(slot, restarts=slot.status.restarts + 1)
        self._publish(slot, state="stopped", tools=(), pid=None)

    async def _serve(self, slot: _Slot) -> str | None:
        """One run of the server: connect, initialize, list tools, wait until it closes.
        Returns why it ended (None: it was stopped)."""
        config = slot.config
        child: Child | None = None
        slot.closed.clear()
        with anyio.CancelScope() as scope:
            slot.scope = scope
            if slot.stopping:
                scope.cancel()
            async with AsyncExitStack() as stack:
                if config.url:
                    read, write = await self._open_http(stack, config)
                else:
                    env = {**os.environ, **resolved_env(config)}
                    read, write, child = await stack.enter_async_context(
                        child_transport(
                            config.command or "",
                            config.args,
                            env,
                            self.log_file(config.name),
                            slot.closed.set,
                        )
                    )
                    self._publish(slot, pid=child.pid)
                from mcp import ClientSession

                session = await stack.enter_async_context(ClientSession(read, write))
                try:
                    with anyio.fail_after(self._start_timeout):
                        await session.initialize()
                        tools = await _list_tools(session)
                except TimeoutError:
                    if child is not None and slot.closed.is_set():
                        return await _exited(child, stack)
                    why = f"did not answer in {self._start_timeout:g} s"
                    if child is not None and child.bad_line is not None:
                        why += f" (it wrote {child.bad_line!r}, not JSON-RPC)"
                    return why
                except Exception as exc:  # noqa: BLE001
                    if child is not None and slot.closed.is_set():
                        return await _exited(child, stack)
                    return error_line(exc)
                slot.session = session
                slot.ready.set()
                self._publish(
                    slot, state="ready", tools=tuple(tool_info(config.name, t) for t in tools)
                )
                await slot.closed.wait()
                slot.session = None
                slot.ready.clear()
                if child is not None:
                    return await _exited(child, stack)
                return "the connection closed"
        return None

    async def _open_http(self, stack: AsyncExitStack, config: McpServer):
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        client = httpx2.AsyncClient(
            headers=resolved_headers(config), timeout=httpx2.Timeout(30.0, read=300.0)
        )
        await stack.enter_async_context(client)
        streams = await stack.enter_async_context(
            streamable_http_client(config.url or "", http_client=client)
        )
        return streams[0], streams[1]

    async def _call(
        self, handle: ToolCallHandle, server: str, tool: str, arguments: dict, timeout_s: float
    ) -> None:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        task = asyncio.current_task()
        self._calls.add(task)
        result: ToolResult = failed("cancelled")
        try:
            with anyio.CancelScope() as scope:
                handle.attach(scope)
                deadline = time.monotonic() + timeout_s
                slot = self._slots.get(server)
                if slot is None:
                    result = failed(f"there is no running MCP server named {server!r}")
                    return
                if slot.session is None and slot.status.state != "starting":
                    result = failed(f"the MCP server {server} is not ready: {slot.status.error}")
                    return
                try:
                    await asyncio.wait_for(slot.ready.wait(), timeout_s)
                except TimeoutError:
                    result = failed(f"the MCP server {server} did not start in {timeout_s:g} s")
                    return
                session, left = slot.session, max(0.1, deadline - time.monotonic())
                try:
                    with anyio.fail_after(left + 5):  # the SDK's own timeout comes first
                        answer = await session.call_tool(tool, arguments, read_timeout_seconds=left)
                    result = tool_result(answer)
                except MCPError as exc:
                    if exc.error.code == REQUEST_TIMEOUT:
                        result = failed(f"{tool} timed out after {timeout_s:g} s")
                    elif exc.error.code == CONNECTION_CLOSED:
                        result = failed(f"the MCP server {server} closed the connection (crashed?)")
                    else:
                        result = failed(f"{tool}: {error_line(exc)}")
                except TimeoutError:
                    result = failed(f"{tool} timed out after {timeout_s:g} s")
                except Exception as exc:  # noqa: BLE001 (a bad answer is the call's result)
                    result = failed(f"{tool}: {error_line(exc)}")
        except asyncio.CancelledError:  # the hub stops
            result = failed("the MCP servers stopped")
        finally:
            self._calls.discard(task)
            handle.settle(result)


async def _list_tools(session) -> list:
    from mcp.types import PaginatedRequestParams

    listing = await session.list_tools()
    tools = list(listing.tools)
    while listing.next_cursor:
        listing = await session.list_tools(
            params=PaginatedRequestParams(cursor=listing.next_cursor)
        )
        tools.extend(listing.tools)
    return tools


async def _exited(child: Child, stack: AsyncExitStack) -> str:
    """Why a child ended: its exit status, once the transport has reaped it."""
    await stack.aclose()
    return f"the server {child.exit_reason()}"
