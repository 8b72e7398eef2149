"""``radixchat serve``: what it says when it serves and when it stops; its API keys
(repeated --api-key, a keys file, $RADIXCHAT_API_KEY); the Ollama port."""

from __future__ import annotations

import argparse
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.api.server import check_bind
from core.cli.commands.options import engine_config_of
from core.cli.main import build_parser
from core.cli.serve import api_keys_of
from core.errors import UserError


def args(keys=(), keys_file=None) -> argparse.Namespace:
    return argparse.Namespace(api_key=list(keys), api_keys_file=keys_file)


def test_keys_from_flags_and_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXCHAT_API_KEY", "from-env")
    keys = tmp_path / "keys.txt"
    keys.write_text("# team keys\nbob-key\n\n  carol-key  \nalice-key\n", encoding="utf-8")
    assert api_keys_of(args(["alice-key"], str(keys))) == ["alice-key", "bob-key", "carol-key"]
    assert api_keys_of(args()) == ["from-env"]  # only when no key is given otherwise
    monkeypatch.delenv("RADIXCHAT_API_KEY")
    assert api_keys_of(args()) == []


def test_bad_keys_files_and_keys_are_one_clear_line(tmp_path):
    with pytest.raises(UserError, match="cannot read the API keys file"):
        api_keys_of(args(keys_file=str(tmp_path / "absent")))
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n", encoding="utf-8")
    with pytest.raises(UserError, match="holds no key"):
        api_keys_of(args(keys_file=str(empty)))
    with pytest.raises(UserError, match="spaces"):
        api_keys_of(args(["two words"]))


def test_beyond_loopback_any_key_will_do():
    check_bind("0.0.0.0", ["a", "b"])
    with pytest.raises(UserError, match="API key"):
        check_bind("0.0.0.0", [])


def test_disk_budget_in_gb_or_a_clear_refusal(capsys):
    parse = build_parser().parse_args

    def budget(argv):
        return engine_config_of(parse(argv)).disk_budget_bytes

    assert budget(["serve"]) is None  # the engine's default
    assert budget(["serve", "--disk-budget", "0.25"]) == 2**28
    assert budget(["serve", "--disk-budget", "2"]) == 2 * 2**30
    for bad in ("0", "-1", "nan", "inf", "ten"):
        with pytest.raises(SystemExit):
            parse(["serve", "--disk-budget", bad])
        assert "--disk-budget" in capsys.readouterr().err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_serve_says_where_it_serves_and_that_it_stops(tiny_model, tmp_path, signum):
    """What a person reads: the address once the model is loaded and the API answers, one
    line when it stops (Ctrl-C or a service manager's SIGTERM), exit 0."""
    root = Path(__file__).resolve().parents[3]
    command = [
        sys.executable,
        "-m",
        "core.cli.main",
        "serve",
        "--model",
        str(tiny_model),
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "data"),
    ]
    with subprocess.Popen(
        command,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as server:
        try:
            lines = []
            # the model loads first; the address comes once the API answers
            for line in server.stderr:
                lines.append(line.rstrip("\n"))
                if line.startswith("radixchat: serving"):
                    break
            serving = re.fullmatch(
                r"radixchat: serving tiny-llama at http://127\.0\.0\.1:(\d+)/v1 \(Ctrl-C to stop\)",
                lines[-1],
            )
            assert serving, lines
            conn = http.client.HTTPConnection("127.0.0.1", int(serving.group(1)), timeout=30)
            conn.request("GET", "/health")
            assert conn.getresponse().status == 200
            conn.close()
            server.send_signal(signum)
            rest = server.stderr.read()
            assert server.wait(60) == 0, rest
            assert rest.splitlines()[-1] == "radixchat: stopping"
            assert lines[0] == "radixchat: loading tiny-llama" and server.stdout.read() == ""
        finally:
            if server.poll() is None:
                server.kill()


@pytest.mark.parametrize(
    ("given", "port"), [([], None), (["--ollama-port"], 11434), (["--ollama-port", "12001"], 12001)]
)
def test_the_ollama_port_option(given, port):
    from core.cli.main import build_parser

    assert build_parser().parse_args(["serve", *given]).ollama_port == port


def test_a_busy_or_clashing_ollama_port_is_refused_before_loading(tmp_path, capsys):
    from core.cli.main import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = busy.getsockname()[1]
        for given, said in (
            (["--port", "0", "--ollama-port", str(taken)], f"port {taken} on 127.0.0.1 is in use"),
            (["--port", "12002", "--ollama-port", "12002"], "--ollama-port 12002 is the --port"),
        ):
            no_model = ["--model", str(tmp_path / "no-such-model"), "--data-dir", str(tmp_path)]
            assert main(["serve", *given, *no_model]) == 2
            err = capsys.readouterr().err.strip()
            assert said in err and "\n" not in err


def test_serve_says_where_ollama_clients_find_it(tiny_model, tmp_path):
    """``--ollama-port``: a second address, answering as Ollama does at its root."""
    root = Path(__file__).resolve().parents[3]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        ollama_port = probe.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "core.cli.main",
        "serve",
        "--model",
        str(tiny_model),
        "--port",
        "0",
        "--ollama-port",
        str(ollama_port),
        "--data-dir",
        str(tmp_path / "data"),
    ]
    with subprocess.Popen(
        command,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as server:
        try:
            lines = []
            for line in server.stderr:
                lines.append(line.rstrip("\n"))
                if line.startswith("radixchat: Ollama's clients"):
                    break
            assert lines[-1] == f"radixchat: Ollama's clients: http://127.0.0.1:{ollama_port}"
            conn = http.client.HTTPConnection("127.0.0.1", ollama_port, timeout=30)
            conn.request("GET", "/")
            response = conn.getresponse()
            assert response.status == 200 and response.read() == b"Ollama is running"
            conn.close()
            server.send_signal(signal.SIGINT)
            assert server.wait(60) == 0
        finally:
            if server.poll() is None:
                server.kill()
