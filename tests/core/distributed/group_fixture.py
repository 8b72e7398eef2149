"""A group of 2 ranks on loopback, started the way a user does: ``radixchat serve --hosts``.

MLX's and mlx-lm's own CI test distributed code this way: every rank a process on
127.0.0.1, talking over MLX's ring backend.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.server_process import free_port, wait_until_answers

ROOT = Path(__file__).resolve().parents[3]
START_S = 120.0  # two processes importing MLX and loading on a busy 2-core machine


def ring_available() -> bool:
    import mlx.core as mx

    from core.mlx_compat import launcher_installed

    return launcher_installed() and mx.distributed.is_available()


needs_ring = pytest.mark.skipif(
    not ring_available(), reason="MLX's ring backend (mlx.launch) is not available"
)


def write_hostfile(path: Path, ranks: int = 2) -> Path:
    path.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * ranks))
    return path


@dataclass
class Group:
    launcher: subprocess.Popen
    port: int
    log: Path
    data_dir: Path

    def request(self, body: dict, timeout: float = 60) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(
                "POST",
                "/v1/chat/completions",
                json.dumps(body),
                {"content-type": "application/json"},
            )
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()

    def chat(self, messages: list[dict], session: str | None = None, max_tokens: int = 24) -> dict:
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
        if session is not None:
            body["session"] = session
        status, reply = self.request(body)
        assert status == 200, (status, reply, self.output())
        return reply

    def stream(self, messages: list[dict], max_tokens: int):
        """An open streaming request: (connection, response) to read SSE lines from."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        conn.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"}
        )
        return conn, conn.getresponse()

    def rank_pid(self, rank: int) -> int:
        """The process of ``rank`` (Linux: read from /proc, by its environment)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if (
                f"MLX_RANK={rank}".encode() in env
                and str(self.data_dir).encode() in cmdline
                and b"--group-member" in cmdline
                and b"bash" not in cmdline.split(b"\0")[0]
            ):
                return int(entry.name)
        raise AssertionError(f"no process for rank {rank}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 60) -> None:
        """Ctrl-C, as a user stops it: every process of the group gets SIGINT."""
        if self.launcher.poll() is None:
            os.killpg(self.launcher.pid, signal.SIGINT)
        try:
            self.launcher.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.launcher.pid, signal.SIGKILL)
            self.launcher.wait()
            raise AssertionError(f"the group did not stop:\n{self.output()}") from None
        _wait_gone(self.launcher.pid)


def _wait_gone(group_id: int, timeout: float = 30) -> None:
    """Until no process of the launcher's process group is left (the ranks outlive it a moment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(group_id, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(group_id, signal.SIGKILL)


def start_group(model: Path, data_dir: Path, work: Path, extra: tuple[str, ...] = ()) -> Group:
    port = free_port()
    log = work / f"group-{port}.log"
    command = [
        sys.executable,
        "-m",
        "core.cli.main",
        "serve",
        "--hosts",
        str(write_hostfile(work / "hosts.json")),
        "--model",
        str(model),
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--ring-port",
        str(free_port(2)),
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:
        launcher = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    group = Group(launcher, port, log, data_dir)
    if wait_until_answers(launcher, port, "/health", START_S):
        return group
    if launcher.poll() is not None:
        raise AssertionError(f"the group exited with {launcher.returncode}:\n{group.output()}")
    group.stop()
    raise AssertionError(f"the group did not start in {START_S:.0f} s:\n{group.output()}")
