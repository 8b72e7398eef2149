"""``radixchat serve --hosts HOSTFILE``: the API on a model split over several machines.

The command checks what it can on this machine (the hostfile, the address, whether the
model splits over that many hosts: its config only, no weights), then runs ``mlx.launch``
with MLX's ring backend, which starts ``radixchat serve --group-member`` on every host.
Rank 0 (the first host) serves the API; the others run rank 0's decisions on their part of
the model (:mod:`core.distributed.engine`).

Stopping the command stops the group (:mod:`core.distributed.stop`): Ctrl-C, SIGTERM or
SIGHUP make rank 0 stop every rank in order, as Ctrl-C on the terminal always did; were the
command killed outright, the launcher sees it gone and does the same.

A rank that dies, cannot be reached or fails ends every open request with an error that
names its host (within about a second of a process dying, ``SILENCE_S`` of a host going
silent), then every rank exits: start the group again (the disk caches restore). The
command then says why in one last line (``ENDED_PREFIX``) and exits with
``EXIT_GROUP_FAULT``; it exits 0 only when the group stopped cleanly (Ctrl-C).

Each launch makes a new secret for the ranks' control channel and hands it to the launcher
in its environment (see :mod:`core.distributed.group`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from core import paths
from core.cli.commands.options import engine_config_of
from core.cli.progress import print_progress
from core.cli.serve import check_serve_args, serve_engine
from core.cli.terminal import safe
from core.distributed.outcome import ENDED_PREFIX, GroupOutcome, fault_line
from core.distributed.stop import LIFELINE_ENV, GroupStopper, on_stop_signals, restore_signals
from core.errors import UserError
from core.models.load.chat_template import read_chat_template

FAULT_GRACE_S = 1.0  # after a fault, rank 0 lets the errors reach the clients, then exits
EXIT_GROUP_FAULT = 3  # serve --hosts's status when a rank died or the group ended on a fault
RELAY_DRAIN_S = 5.0  # after the launcher exits, its last lines still to pass on


def run_group(args) -> int:
    """Check, then start every rank with ``mlx.launch``; wait for the group to end."""
    from core.distributed.launch import choose_backend, launch_command, read_hostfile
    from core.distributed.shard import model_config, split_plan
    from core.models.load.loader import resolve_spec

    if getattr(args, "kv_bits", None):
        raise UserError("--kv-bits does not work with --hosts yet: a group keeps full-precision KV")
    hosts = read_hostfile(args.hosts)
    backend = choose_backend(args.hosts, args.backend)
    check_serve_args(args)  # rank 0 is this machine: its address and port
    root = paths.data_dir(args.data_dir)
    if args.chat_template:
        read_chat_template(args.chat_template)  # a bad file fails here, not on every host
    path = resolve_spec(args.model, root, print_progress)
    plan = split_plan(model_config(path), len(hosts), path.name, args.split)
    serve_args = [
        "--model",
        str(path),
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--data-dir",
        str(root),
        "--split",
        plan.method,
    ]
    for origin in args.allow_origin or ():
        serve_args += ["--allow-origin", origin]
    if getattr(args, "ollama_port", None) is not None:
        serve_args += ["--ollama-port", str(args.ollama_port)]
    if args.kv_tokens:
        serve_args += ["--kv-tokens", str(args.kv_tokens)]
    if getattr(args, "disk_budget", None) is not None:
        serve_args += ["--disk-budget", repr(args.disk_budget)]
    if args.chat_template:
        serve_args += ["--chat-template", os.path.abspath(args.chat_template)]
    for key in args.api_key or ():  # rank 0 serves: it needs the keys (as typed, like the rest)
        serve_args += ["--api-key", key]
    if getattr(args, "api_keys_file", None):
        serve_args += ["--api-keys-file", os.path.abspath(args.api_keys_file)]
    command = launch_command(args.hosts, hosts, serve_args, args.ring_port, backend)
    print(
        f"radixchat: starting {safe(path.name)} split over {len(hosts)} hosts "
        f"({', '.join(h.ssh for h in hosts)}; {plan.describe()}; {backend} backend)",
        file=sys.stderr,
        flush=True,
    )
    launcher, lifeline = _start_launcher(command)
    # From here the command's stop signals stop the launcher's whole group (core.distributed.stop):
    # SIGINT first, which only rank 0 acts on, then harder if it has not ended.
    stopper = GroupStopper(launcher.pid)
    previous = on_stop_signals(stopper.stop)
    try:
        outcome = GroupOutcome([h.ssh for h in hosts])
        relay = threading.Thread(
            target=_relay,
            args=(launcher.stderr, outcome),
            daemon=True,
            name="radixchat-group-stderr",
        )
        relay.start()
        code = launcher.wait()
        relay.join(RELAY_DRAIN_S)
    finally:
        stopper.close()
        restore_signals(previous)
        os.close(lifeline)
    verdict = outcome.verdict(code)
    if verdict is None:
        return 0
    print(f"{ENDED_PREFIX}{safe(verdict)}", file=sys.stderr, flush=True)
    return EXIT_GROUP_FAULT


def _start_launcher(command: list[str]) -> tuple[subprocess.Popen, int]:
    """MLX's launcher, in a process group of its own (its ranks on this machine join it),
    and the write end of its lifeline (see core.distributed.stop), to hold until it ends.

    The launcher starts with SIGINT ignored, which its ranks and ssh's inherit: a group's
    SIGINT is for rank 0 alone (it stops the group in order), and the launcher lives on to
    relay the ranks' last words. Its stdin is a pipe nobody writes to: MLX's launcher relays
    its stdin to the ranks with a select loop that spins on a stdin at end of file
    (/dev/null, as under a service). $RADIXCHAT_API_KEY, if set, stays in the environment."""
    from core.distributed.group import SECRET_ENV, new_secret

    lifeline_read, lifeline_write = os.pipe()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        launcher = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, SECRET_ENV: new_secret(), LIFELINE_ENV: str(lifeline_read)},
            pass_fds=(lifeline_read,),
            start_new_session=True,
        )
    except BaseException:
        os.close(lifeline_write)
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
        os.close(lifeline_read)
    return launcher, lifeline_write


def _relay(stream, outcome: GroupOutcome) -> None:
    """Pass the group's stderr on as it comes (progress bars redraw with a carriage return,
    not a newline), reading how it ends line by line."""
    pending = b""
    for chunk in iter(lambda: os.read(stream.fileno(), 65536), b""):
        sys.stderr.buffer.write(chunk)
        sys.stderr.buffer.flush()
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            outcome.read(line.decode(errors="replace"))
    if pending:
        outcome.read(pending.decode(errors="replace"))


def run_group_member(args) -> int:
    """One rank: join the group, load this rank's part; rank 0 serves, the others follow."""
    from core.distributed.engine import ShardedEngine
    from core.distributed.group import join_group

    engine: ShardedEngine | None = None
    leader = os.environ.get("MLX_RANK", "0") == "0"

    def on_fault(message: str) -> None:
        print(fault_line(message), file=sys.stderr, flush=True)
        if engine is not None and leader:
            engine.fail_group(f"the model's group broke: {message}")
            threading.Timer(FAULT_GRACE_S, os._exit, (EXIT_GROUP_FAULT,)).start()
        else:
            os._exit(EXIT_GROUP_FAULT)

    if leader:
        # started ignoring it (see run_group)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        api_key, origins = check_serve_args(args)
    else:
        # Ctrl-C reaches every rank: rank 0 stops the group
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    root = paths.data_dir(args.data_dir)
    config = engine_config_of(args)
    mlx_group, channel = join_group(on_fault)
    member = channel.member
    engine = ShardedEngine(
        root,
        member,
        mlx_group,
        channel,
        split=args.split,
        model_spec=args.model,
        config=config,
        on_load_progress=print_progress if leader else None,
    )
    engine.start()
    if leader:
        what = f" split over {member.world} hosts"
        return serve_engine(engine, args, api_key, origins, what)
    try:
        engine.wait_ready()
    except UserError as exc:
        print(f"radixchat: {member.name(member.rank)}: {exc}", file=sys.stderr, flush=True)
        os._exit(2)
    engine.wait_stopped()
    os._exit(0)  # the engine thread is parked (see Engine._park)
