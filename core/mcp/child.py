"""A stdio MCP server as a child process: the transport an ``mcp.ClientSession`` runs over.

The SDK's ``stdio_client`` keeps its process to itself; the hub needs the child's pid (to
show it, and for tests that check no child outlives the hub), its exit status (the reason a
crashed server shows), the moment its stdout closes (a crash, noticed without waiting for a
request) and its stderr in a log file the user can open. So this module spawns the child
with ``anyio.open_process`` in its own session (process group), and bridges its pipes to
the two memory streams ``ClientSession`` takes, one JSON-RPC message a line, as the SDK's
transport does. Stopping follows the MCP lifecycle: stdin closed, a grace period, then
SIGTERM and SIGKILL to the child's whole process group (an ``npx`` wrapper's server too).
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import mcp_types
from mcp.shared.message import SessionMessage

GRACE_S = 2.0  # after stdin closes, for the server to exit by itself
TERM_S = 2.0  # after SIGTERM, before SIGKILL


@dataclass
class Child:
    """What the hub knows of a running child: its pid, its exit status once it has one,
    the first line it wrote that was not JSON-RPC."""

    pid: int
    returncode: int | None = None
    bad_line: str | None = None

    def exit_reason(self) -> str:
        """ "exited with code 3", "killed by SIGKILL", or "closed its output"."""
        code = self.returncode
        if code is None:
            return "closed its output"
        if code < 0:
            with suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
            return f"killed by signal {-code}"
        return f"exited with code {code}"


@asynccontextmanager
async def child_transport(
    command: str,
    args: tuple[str, ...],
    env: dict[str, str],
    log_path: Path,
    on_close: Callable[[], None],
) -> AsyncIterator[tuple[anyio.abc.ObjectReceiveStream, anyio.abc.ObjectSendStream, Child]]:
    """Start ``command args`` (stderr appended to ``log_path``) and yield the session's read
    and write streams and the :class:`Child`. ``on_close`` is called when the child's stdout
    closes (it exited or crashed). Leaving the context stops the child and its group."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = await anyio.open_process(
            [command, *args], env=env, stderr=log, start_new_session=True
        )
        child = Child(pid=process.pid)
        read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

        async def read_stdout() -> None:
            buffer = b""
            try:
                async with read_writer:
                    with suppress(anyio.EndOfStream, anyio.ClosedResourceError, OSError):
                        async for chunk in process.stdout:
                            *lines, buffer = (buffer + chunk).split(b"\n")
                            for line in lines:
                                if line.strip():
                                    await read_writer.send(_parse(line, child))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # the session is gone
            finally:
                on_close()

        async def write_stdin() -> None:
            try:
                async with write_reader:
                    async for message in write_reader:
                        text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                        await process.stdin.send(text.encode() + b"\n")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                await read_writer.aclose()  # the session sees the connection end

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read_stdout)
            tasks.start_soon(write_stdin)
            try:
                yield read_stream, write_stream, child
            finally:
                with anyio.CancelScope(shield=True):
                    child.returncode = await _stop(process)
                    for stream in (read_stream, write_stream):
                        await stream.aclose()
                tasks.cancel_scope.cancel()


def _parse(line: bytes, child: Child) -> SessionMessage | Exception:
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        if child.bad_line is None:
            child.bad_line = line[:80].decode("utf-8", "backslashreplace")
        return exc


async def _stop(process: anyio.abc.Process) -> int | None:
    """Close stdin, wait, then SIGTERM and SIGKILL the child's process group; its status."""
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    for sig, wait_s in ((None, GRACE_S), (signal.SIGTERM, TERM_S), (signal.SIGKILL, TERM_S)):
        if sig is not None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
        with anyio.move_on_after(wait_s):
            await process.wait()
        if process.returncode is not None:
            break
    if process.returncode is not None:  # the rest of its group (a wrapper's children)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.aclose()
    return process.returncode
