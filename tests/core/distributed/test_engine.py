"""The engine of a group's ranks (:mod:`core.distributed.engine`) driven directly, on 2 ranks
on loopback (MLX's ring backend, started by MLX's launcher): what a client asks of the
engine besides requests reaches every rank, with every field of the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from bench.server_process import free_port
from core.distributed.group import HOSTS_ENV, SECRET_ENV, new_secret
from core.distributed.launch import launcher_command
from core.distributed.shard import rank_cache_name
from core.engine.namespaces import APP
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.store import DiskStore
from kvcache.store_format import session_row
from tests.core.distributed.group_fixture import ROOT, START_S, needs_ring, write_hostfile

pytestmark = [needs_ring, pytest.mark.distributed]

# Each rank: join the group, load its shard; rank 0 runs two chats of the app's namespace,
# forgets one, and stops the group (the other ranks follow its ticks until then).
RANK = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path

    from core.distributed.engine import ShardedEngine
    from core.distributed.group import join_group
    from core.engine.config import EngineConfig
    from core.engine.types import ChatMessage, DoneEvent, GenerationRequest, SamplingParams

    data, model, namespace = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

    def on_fault(message):
        print(f"fault: {message}", file=sys.stderr, flush=True)
        os._exit(3)

    mlx_group, channel = join_group(on_fault)
    config = EngineConfig(pool_tokens=1024)
    engine = ShardedEngine(
        data, channel.member, mlx_group, channel, model_spec=model, config=config
    ).start()
    engine.wait_ready(120)
    if not channel.member.leader:
        engine.wait_stopped()
        os._exit(0)
    for session in ("kept", "gone"):
        request = GenerationRequest(
            messages=(ChatMessage("user", f"A chat named {session}, long enough to store."),),
            sampling=SamplingParams(temperature=0.0, max_tokens=4),
            session=session,
            cache_namespace=namespace,
        )
        done = list(engine.stream(request))[-1]
        assert isinstance(done, DoneEvent), done
    engine.flush_disk_cache(60)
    engine.forget_session("gone", namespace)
    engine.flush_disk_cache(60)
    engine.shutdown(60)
    print("rank 0 stopped the group", flush=True)
    os._exit(0 if engine.fault is None else 4)
    """
)


def test_forgetting_a_session_on_a_group_forgets_it_on_every_rank(tmp_path):
    model = write_tiny_model(tmp_path / "tiny-llama", TinyModelSpec(num_layers=2))
    data = tmp_path / "data"
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    command = [
        *launcher_command(),
        "--backend",
        "ring",
        "--hostfile",
        str(write_hostfile(tmp_path / "hosts.json")),
        "--starting-port",
        str(free_port(2)),
        "--env",
        f"{HOSTS_ENV}={json.dumps(['127.0.0.1', '127.0.0.1'])}",
        "--env",
        f"PYTHONPATH={ROOT}",
        "--",
        sys.executable,
        str(script),
        str(data),
        str(model),
        APP,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), SECRET_ENV: new_secret()}
    ran = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=START_S + 60
    )
    output = ran.stdout + ran.stderr
    assert "rank 0 stopped the group" in output, output
    assert "fault" not in output and "Traceback" not in output, output
    for rank in (0, 1):  # each rank's own slice of the disk cache
        with DiskStore(data / rank_cache_name(rank, 2)) as store:
            assert store.session(session_row("kept", APP)) is not None, rank
            assert store.session(session_row("gone", APP)) is None, rank
