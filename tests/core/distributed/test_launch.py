"""The command that starts a group, for a source checkout and for the packaged app (which
ships no `mlx.launch` script: MLX's launcher runs inside our own executable), and the
launcher route itself, run for real on one local rank."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from core.cli.main import main
from core.distributed.group import SECRET_ENV, new_secret
from core.distributed.launch import LAUNCH_COMMAND, launch_command, read_hostfile

ROOT = Path(__file__).resolve().parents[3]


def hostfile(tmp_path) -> Path:
    path = tmp_path / "hosts.json"
    path.write_text(
        json.dumps(
            [
                {"ssh": "studio.local", "ips": ["10.0.0.1"]},
                {"ssh": "macbook.local", "ips": ["10.0.0.2"]},
            ]
        )
    )
    return path


def test_the_packaged_app_launches_a_group_through_itself(tmp_path, monkeypatch):
    app = "/Applications/RadixChat.app/Contents/MacOS/RadixChat"
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", app)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    path = hostfile(tmp_path)
    command = launch_command(path, read_hostfile(path), ["--model", "/m", "--port", "8000"], 40000)
    split = command.index("--")
    launcher, member = command[:split], command[split + 1 :]
    assert launcher[:2] == [app, LAUNCH_COMMAND]  # MLX's launcher, inside the app's own executable
    assert launcher[launcher.index("--backend") + 1] == "ring"
    assert launcher[launcher.index("--hostfile") + 1] == str(path)
    assert launcher[launcher.index("--starting-port") + 1] == "40000"
    assert 'RADIXCHAT_GROUP_HOSTS=["studio.local", "macbook.local"]' in launcher
    assert member == [app, "serve", "--model", "/m", "--port", "8000", "--group-member"]
    assert not any(SECRET_ENV in part for part in command)  # the secret never rides a command line


def test_a_source_checkout_launches_through_python(tmp_path, monkeypatch):
    monkeypatch.delattr(sys, "frozen", raising=False)
    monkeypatch.setenv("PYTHONPATH", "/src/radixchat")
    path = hostfile(tmp_path)
    command = launch_command(path, read_hostfile(path), ["--model", "/m"])
    assert command[:4] == [sys.executable, "-m", "core.cli.main", LAUNCH_COMMAND]
    assert "PYTHONPATH=/src/radixchat" in command
    assert command[command.index("--") + 1 :] == [
        sys.executable,
        "-m",
        "core.cli.main",
        "serve",
        "--model",
        "/m",
        "--group-member",
    ]


def test_the_hidden_launcher_runs_mlxs(capsys):
    assert main([LAUNCH_COMMAND, "--print-python"]) == 0
    assert capsys.readouterr().out.strip() == sys.executable


def test_the_launcher_hands_the_secret_to_a_rank_in_its_environment_only(tmp_path):
    secret = new_secret()
    # the rank's own command line must not hold it
    digest = hashlib.sha256(secret.encode()).hexdigest()
    rank = (
        f"import hashlib, os; secret = os.environ[{SECRET_ENV!r}]; "
        "cmdline = open('/proc/self/cmdline', 'rb').read(); "
        "print('rank', os.environ['MLX_RANK'], "
        f"hashlib.sha256(secret.encode()).hexdigest() == {digest!r}, secret.encode() in cmdline)"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "core.cli.main",
            LAUNCH_COMMAND,
            "--hosts",
            "127.0.0.1",
            "--",
            sys.executable,
            "-c",
            rank,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), SECRET_ENV: secret},
        stdin=subprocess.PIPE,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["rank", "0", "True", "False"], (done.stdout, done.stderr)
