"""``radixchat serve --hosts``: stopping the command stops the whole group.

A service manager stops it with SIGTERM, a user with Ctrl-C (only the command's own process
group gets it when the group runs in the background, or `kill -INT PID`): either way MLX's
launcher and every rank end with it, rank 0 stopping the group in order (each rank flushes
its disk cache), and the command exits 0. Were the command itself killed outright, the
launcher sees it gone and stops the group the same way."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.core.distributed.group_fixture import needs_ring, start_group

pytestmark = [needs_ring, pytest.mark.distributed, pytest.mark.faults]

GONE_S = 60.0  # rank 0 stops the group in order: each rank flushes its cache, then exits


def launcher_pid(data_dir: Path) -> int:
    """MLX's launcher of the group serving from ``data_dir`` (Linux: read from /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"_launch-group" in cmdline and any(str(data_dir).encode() in part for part in cmdline):
            return int(entry.name)
    raise AssertionError("no launcher process")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended: only its parent has not read its status yet


def wait_all_gone(pids: list[int], timeout: float = GONE_S) -> list[int]:
    """The pids still running after ``timeout`` (none, when all ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def group_processes(group) -> list[int]:
    return [launcher_pid(group.data_dir), group.rank_pid(0), group.rank_pid(1)]


def kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_signal_to_the_command_alone_stops_the_whole_group(tiny_model, tmp_path, signum):
    """Today: SIGTERM killed the command and left the launcher and both ranks serving; a
    SIGINT to it alone was swallowed (only Ctrl-C, reaching every process, stopped them)."""
    group = start_group(tiny_model, tmp_path / "data", tmp_path)
    pids = group_processes(group)
    try:
        os.kill(group.launcher.pid, signum)  # the command alone, not its process group
        try:
            code = group.launcher.wait(GONE_S)
        except Exception:
            raise AssertionError(f"the command did not end:\n{group.output()}") from None
        left = wait_all_gone(pids)
        assert left == [], f"still running: {left}\n{group.output()}"
        assert code == 0, group.output()
        assert "radixchat: stopping" in group.output()  # rank 0 stopped the group in order
        lines = group.output().splitlines()  # what a person reads, from the start
        assert lines[0] == (
            "radixchat: starting tiny-llama split over 2 hosts (127.0.0.1, 127.0.0.1; "
            "1 of 2 KV heads each; ring backend)"
        )
        assert (
            f"radixchat: serving tiny-llama split over 2 hosts at http://127.0.0.1:{group.port}/v1 "
            "(Ctrl-C to stop)" in lines
        )
        assert "the group ended on a fault" not in group.output()
    finally:
        kill_leftovers(pids)
        group.stop()


def test_a_killed_command_takes_its_group_with_it(tiny_model, tmp_path):
    """SIGKILL cannot be caught: the launcher notices the command is gone and stops the
    group. Today: the launcher and both ranks went on serving."""
    group = start_group(tiny_model, tmp_path / "data", tmp_path)
    pids = group_processes(group)
    try:
        os.kill(group.launcher.pid, signal.SIGKILL)
        group.launcher.wait(10)
        left = wait_all_gone(pids)
        assert left == [], f"still running: {left}\n{group.output()}"
    finally:
        kill_leftovers(pids)
        group.stop()


def test_kv_bits_with_hosts_is_refused_in_one_line(tmp_path, capsys):
    from core.cli.main import main

    hostfile = tmp_path / "hosts.json"
    hostfile.write_text('[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]')
    args = ["serve", "--hosts", str(hostfile), "--kv-bits", "8", "--data-dir", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["radixchat: error: --kv-bits does not work with --hosts yet: a group keeps "
                   "full-precision KV"]  # fmt: skip
