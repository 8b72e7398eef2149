"""Which backend a group starts on (ring, or JACCL where MLX offers it), and JACCL refused in
one line where it cannot run. Nothing here can run JACCL for real (it needs Macs joined by
Thunderbolt 5 with RDMA enabled): the choice, the checks and the command are tested."""

from __future__ import annotations

import json

import pytest

from core.cli.main import main
from core.distributed import launch
from core.distributed.group import launched_backend
from core.distributed.launch import choose_backend, launch_command, read_hostfile
from core.errors import UserError
from core.models.tiny_model import TinyModelSpec, write_tiny_model

TWO = [{"ssh": "studio", "ips": ["10.0.0.1"]}, {"ssh": "macbook", "ips": ["10.0.0.2"]}]
RDMA = [{**TWO[0], "rdma": [None, "rdma_en3"]}, {**TWO[1], "rdma": ["rdma_en3", None]}]


def hostfile(tmp_path, data) -> str:
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture
def on_a_mac_with_jaccl(monkeypatch):
    import mlx.core as mx

    monkeypatch.setattr(launch.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(mx.distributed, "is_available", lambda backend="any": True)


def test_ring_unless_the_option_or_the_hostfile_asks_for_jaccl(tmp_path, on_a_mac_with_jaccl):
    assert choose_backend(hostfile(tmp_path, TWO)) == "ring"
    assert choose_backend(hostfile(tmp_path, {"hosts": RDMA})) == "ring"
    assert choose_backend(hostfile(tmp_path, {"backend": "jaccl", "hosts": RDMA})) == "jaccl"
    assert choose_backend(hostfile(tmp_path, RDMA), "jaccl") == "jaccl"
    assert choose_backend(hostfile(tmp_path, {"backend": "jaccl", "hosts": RDMA}), "ring") == "ring"
    with pytest.raises(UserError, match="asks for the 'mpi' backend"):
        choose_backend(hostfile(tmp_path, {"backend": "mpi", "hosts": TWO}))


def test_jaccl_needs_an_rdma_device_towards_every_other_host(tmp_path, on_a_mac_with_jaccl):
    with pytest.raises(UserError, match='gives studio no "rdma" device'):
        choose_backend(hostfile(tmp_path, TWO), "jaccl")
    with pytest.raises(UserError, match='gives macbook no "rdma" device'):
        choose_backend(hostfile(tmp_path, [RDMA[0], {**RDMA[1], "rdma": [None, None]}]), "jaccl")


def test_jaccl_is_refused_where_it_cannot_run(tmp_path, monkeypatch):
    import mlx.core as mx

    path = hostfile(tmp_path, {"backend": "jaccl", "hosts": RDMA})
    monkeypatch.setattr(launch.platform, "system", lambda: "Linux")
    with pytest.raises(UserError, match="runs on macOS only, not Linux: use --backend ring"):
        choose_backend(path)
    monkeypatch.setattr(launch.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(mx.distributed, "is_available", lambda backend="any": backend != "jaccl")
    with pytest.raises(UserError, match="cannot use JACCL here .*macOS 26.2"):
        choose_backend(path)


def test_serve_hosts_refuses_jaccl_in_one_line_before_anything_starts(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(launch.platform, "system", lambda: "Linux")  # as here; also on a Mac CI
    model = write_tiny_model(tmp_path / "m", TinyModelSpec())
    calls = []
    monkeypatch.setattr(
        launch, "launcher_command", lambda: calls.append("launcher") or ["mlx.launch"]
    )
    code = main(
        [
            "serve",
            "--hosts",
            hostfile(tmp_path, RDMA),
            "--backend",
            "jaccl",
            "--model",
            str(model),
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        code == 2 and len(err) == 1 and "JACCL (RDMA over Thunderbolt) runs on macOS only" in err[0]
    )
    assert calls == []  # MLX's launcher never looked for, nothing started


def test_the_launch_command_names_the_backend_and_each_rank_joins_it(tmp_path):
    path = hostfile(tmp_path, RDMA)
    command = launch_command(path, read_hostfile(path), ["--model", "m"], backend="jaccl")
    assert command[command.index("--backend") + 1] == "jaccl"
    # a rank joins what mlx.launch started it for: JACCL's coordinator, else the ring's hostfile
    assert launched_backend({"MLX_JACCL_COORDINATOR": "10.0.0.1:32323", "MLX_RANK": "1"}) == "jaccl"
    assert launched_backend({"MLX_HOSTFILE": "/tmp/h.json", "MLX_RANK": "1"}) == "ring"
    assert launched_backend({}) is None
