"""Starting a group: the hostfile, and the ``mlx.launch`` command that runs every rank.

The hostfile is MLX's own (``mlx.launch --hostfile``): JSON, a list of hosts (or an object
with ``"hosts"``), each with the name ``ssh`` reaches it by and the ``ips`` the ring
connects over (a Thunderbolt bridge's or the Ethernet address)::

    [{"ssh": "mac-studio.local", "ips": ["10.0.0.1"]},
     {"ssh": "macbook.local", "ips": ["10.0.0.2"]}]

Rank 0 is the first host: it serves the API, so list this machine first. Every host needs
RadixChat at the same path and the model at the same path (or the same data folder name).

The backend is MLX's ring (TCP over any network) unless ``--backend`` or the hostfile's
``"backend"`` asks for JACCL (RDMA over Thunderbolt 5, macOS 26.2+), whose hostfile also
lists each host's RDMA device towards every other host (``"rdma"``, MLX's format, as
``mlx.distributed_config --backend jaccl`` writes it). Where JACCL cannot run it is refused
here, in one line, before anything starts.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from core.distributed.group import HOSTS_ENV, SECRET_ENV
from core.errors import UserError
from core.mlx_compat import launcher_installed
from core.mlx_compat import run_launcher as run_mlx_launcher


@dataclass(frozen=True)
class Host:
    ssh: str
    ips: tuple[str, ...]


def read_hostfile(path: str | os.PathLike) -> list[Host]:
    """The hosts of ``path``, checked: at least two, each with an IP for the ring."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no hostfile at {path}") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"the hostfile {path} is not readable JSON: {exc}") from exc
    entries = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and e.get("ssh") for e in entries
    ):
        raise UserError(f'the hostfile {path} must list hosts as {{"ssh": NAME, "ips": [IP]}}')
    hosts = [Host(str(e["ssh"]), tuple(str(ip) for ip in e.get("ips") or ())) for e in entries]
    if len(hosts) < 2:
        raise UserError(f"the hostfile {path} lists {len(hosts)} host: a group needs at least 2")
    missing = [h.ssh for h in hosts if not h.ips]
    if missing:
        raise UserError(
            f"the hostfile {path} gives no IP for {', '.join(missing)}: the ring backend "
            "connects over IPs (a Thunderbolt bridge's or the Ethernet address)"
        )
    return hosts


BACKENDS = ("ring", "jaccl")


def choose_backend(path: str | os.PathLike, requested: str | None = None) -> str:
    """The backend the group runs on: ``requested`` (``--backend``), else the hostfile's
    ``"backend"``, else ring; a backend that cannot run here is refused in one line."""
    data = json.loads(Path(path).read_text())  # read_hostfile has checked it
    backend = requested or (data.get("backend") if isinstance(data, dict) else None) or "ring"
    if backend not in BACKENDS:
        raise UserError(
            f"the hostfile {path} asks for the {backend!r} backend: a group runs on ring or jaccl"
        )
    if backend == "jaccl":
        check_jaccl(data.get("hosts") if isinstance(data, dict) else data, path)
    return backend


def check_jaccl(entries: list[dict], path) -> None:
    """JACCL can run here (macOS, an MLX with it) and the hostfile names the RDMA devices."""
    import mlx.core as mx

    if platform.system() != "Darwin":
        raise UserError(
            f"JACCL (RDMA over Thunderbolt) runs on macOS only, not {platform.system()}: "
            "use --backend ring"
        )
    if not mx.distributed.is_available("jaccl"):
        raise UserError(
            "this MLX cannot use JACCL here (it needs macOS 26.2 or later on Thunderbolt 5, "
            "RDMA enabled with `rdma_ctl enable` in macOS Recovery): use --backend ring"
        )
    for i, entry in enumerate(entries):
        rdma = entry.get("rdma")
        if (
            not isinstance(rdma, list)
            or len(rdma) != len(entries)
            or rdma[i] is not None
            or any(d is None for j, d in enumerate(rdma) if j != i)
        ):
            raise UserError(
                f'the hostfile {path} gives {entry.get("ssh")} no "rdma" device towards every '
                "other host (null for itself): write it with "
                "`mlx.distributed_config --backend jaccl`"
            )


# the hidden subcommand that runs MLX's launcher (see run_launcher)
LAUNCH_COMMAND = "_launch-group"


def radixchat_command() -> list[str]:
    """How to run ``radixchat`` (this same program) again, for a rank or for the launcher."""
    if getattr(sys, "frozen", False):  # the packaged app is its own interpreter
        return [sys.executable]
    return [sys.executable, "-m", "core.cli.main"]


def member_command() -> list[str]:
    """How a rank runs ``radixchat``."""
    return radixchat_command()


def launcher_command() -> list[str]:
    """How to run MLX's launcher (``mlx.launch``'s code): through our own hidden subcommand,
    so that the packaged app, which ships no ``mlx.launch`` script, can start a group too."""
    if not launcher_installed():
        raise UserError("MLX's launcher (mlx._distributed_utils) is missing: install mlx")
    return [*radixchat_command(), LAUNCH_COMMAND]


def run_launcher(argv: list[str]) -> int:
    """``radixchat _launch-group ARGS``: ``mlx.launch ARGS`` run in this process. The group's
    secret comes in this process's environment (not on a command line) and goes on to every
    rank the way ``mlx.launch --env`` sends variables."""
    _stop_the_group_when_the_command_is_gone()
    secret = os.environ.get(SECRET_ENV)
    env = ["--env", f"{SECRET_ENV}={secret}"] if secret else []
    run_mlx_launcher([*env, *argv])  # it logs each rank's exit (see core.distributed.outcome)
    return 0


def _stop_the_group_when_the_command_is_gone() -> None:
    """``serve --hosts`` hands this launcher the read end of its lifeline (see
    core.distributed.stop): when the command is gone (killed outright), stop this process
    group (the ranks on this machine, the ssh's to the others) as the command would have.
    Nobody reads this launcher's output any more then: it goes nowhere, so that writing it
    does not end the launcher before its ranks."""
    from core.distributed.stop import LIFELINE_ENV, GroupStopper, watch_lifeline

    fd = os.environ.pop(LIFELINE_ENV, None)  # popped: the ranks do not inherit it
    if fd is None or not fd.isdigit():
        return

    def command_gone() -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (1, 2):
            os.dup2(devnull, stream)
        os.close(devnull)
        GroupStopper(os.getpgrp()).stop()

    watch_lifeline(int(fd), command_gone)


def launch_command(
    hostfile: str | os.PathLike,
    hosts: list[Host],
    serve_args: list[str],
    starting_port: int | None = None,
    backend: str = "ring",
) -> list[str]:
    """The ``mlx.launch`` command that starts ``radixchat serve`` on every host."""
    command = [
        *launcher_command(),
        "--backend",
        backend,
        "--hostfile",
        str(hostfile),
        "--env",
        f"{HOSTS_ENV}={json.dumps([h.ssh for h in hosts])}",
    ]
    if os.environ.get("PYTHONPATH"):  # a source checkout: the same tree on every host
        command += ["--env", f"PYTHONPATH={os.environ['PYTHONPATH']}"]
    if starting_port is not None:
        command += ["--starting-port", str(starting_port)]
    return [*command, "--", *member_command(), "serve", *serve_args, "--group-member"]
