"""``radixchat bench NAME`` (core/cli/commands/bench.py): one table of benches, each run by
importing ``bench.module:function`` by name; the same benches and options as before the
table, and one line where the benchmarks are not there (the packaged app)."""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
from pathlib import Path

import pytest

from core.cli.commands import bench as bench_command
from core.cli.main import EXIT_USER_ERROR, build_parser, main

ROOT = Path(__file__).resolve().parents[4]

# Each bench's options, in --help's order, as main listed them before the table
# (e6ca32b; -h/--help and the --json every bench has left out).
OPTIONS_BEFORE = {
    "hostile": (
        "--data-dir",
        "--model",
        "--scenes",
        "--connections",
        "--streams",
        "--long-tokens",
        "--tools",
        "--probes",
        "--kv-tokens",
    ),
    "cpu": ("--data-dir", "--model", "--repeats", "--prompt-tokens", "--decode-tokens"),
    "multiturn": (
        "--data-dir",
        "--model",
        "--turns",
        "--max-tokens",
        "--repeats",
        "--page-size",
        "--segment-mb",
    ),
    "restore": ("--data-dir", "--model", "--tokens", "--repeats", "--api"),
    "pressure": ("--data-dir", "--model", "--clients", "--tokens", "--rounds", "--repeats"),
    "distributed": (
        "--data-dir",
        "--model",
        "--prompt-tokens",
        "--max-tokens",
        "--kv-tokens",
        "--repeats",
        "--split",
    ),
    "serve": ("--data-dir", "--model", "--streams", "--against", "--max-tokens", "--repeats"),
    "agent": (
        "--data-dir",
        "--model",
        "--max-tokens",
        "--repeats",
        "--rounds",
        "--chat-template",
        "--endpoint",
        "--nocache-every",
        "--skip-nocache",
    ),
    "followup": (
        "--data-dir",
        "--model",
        "--prefix-tokens",
        "--new-tokens",
        "--max-tokens",
        "--repeats",
    ),
    "fork": ("--data-dir", "--model", "--turns", "--lines", "--pool-tokens", "--repeats"),
    "tool-loop": (  # added after the table (issue 46)
        "--data-dir",
        "--model",
        "--steps",
        "--restart-after",
        "--mcp-command",
        "--tools",
        "--answer-tokens",
        "--pool-tokens",
    ),
    "clients": (
        "--data-dir",
        "--model",
        "--claude",
        "--codex",
        "--task",
        "--max-turns",
        "--timeout-s",
        "--max-output-tokens",
        "--kv-tokens",
        "--no-mlx-lm",
    ),
    "constrain": ("--data-dir", "--model", "--max-tokens", "--repeats", "--chat-template"),
    "fairness": ("--data-dir", "--model", "--long-tokens", "--max-tokens", "--repeats"),
    "key-fairness": (
        "--data-dir",
        "--model",
        "--long-tokens",
        "--queue",
        "--queue-tokens",
        "--repeats",
    ),
    "pull": ("--mb", "--repeats"),
    "switch": ("--data-dir", "--models", "--switches", "--pool-mb"),
    "kv-quality": ("--data-dir", "--models", "--prompts", "--max-tokens", "--group-size"),
    "kv-capacity": (
        "--data-dir",
        "--model",
        "--tokens",
        "--budget-mb",
        "--decode-tokens",
        "--group-size",
        "--repeats",
    ),
    "speculative": ("--data-dir", "--model", "--cases", "--max-tokens", "--repeats"),
    "llamacpp": ("--data-dir", "--model", "--prompts", "--max-tokens", "--threads"),
    "soak": (
        "--data-dir",
        "--model",
        "--minutes",
        "--disk-budget-mb",
        "--kv-tokens",
        "--max-tokens",
        "--mirror-share",
        "--sample-s",
        "--request-timeout-s",
    ),
    "gui": ("--data-dir", "--model", "--max-tokens", "--repeats"),
}


def bench_parsers() -> dict[str, argparse.ArgumentParser]:
    """``radixchat bench``'s subcommands, by name, in --help's order."""
    top = build_parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    bench = commands.choices["bench"]
    benches = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))
    return dict(benches.choices)


def test_the_same_benches_with_the_same_options_as_before_the_table():
    parsers = bench_parsers()
    assert list(parsers) == list(OPTIONS_BEFORE)
    for name, parser in parsers.items():
        options = tuple(s for a in parser._actions for s in a.option_strings)
        assert options == ("-h", "--help", *OPTIONS_BEFORE[name], "--json"), name


def test_bench_help_lists_each_bench_with_its_help_line(capsys):
    with pytest.raises(SystemExit) as done:
        main(["bench", "--help"])
    assert done.value.code == 0
    listed = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    for entry in bench_command.BENCHES:
        line = " ".join(entry.help.replace("%%", "%").split())
        assert f"{entry.name} {line}" in listed, entry.name


def targets() -> list[str]:
    return [
        target
        for entry in bench_command.BENCHES
        for target in (entry.target, *(entry.instead[1:] if entry.instead else ()))
    ]


def test_every_target_is_a_function_of_a_bench_module():
    for target in targets():
        module_name, _, function = target.partition(":")
        assert module_name.startswith("bench."), target
        assert callable(getattr(importlib.import_module(module_name), function)), target


def test_every_bench_runner_is_in_the_table():
    """A ``run_bench_*`` function in bench/ that no row names would be a bench nobody can run."""
    runners = {
        f"bench.{path.stem}:{node.name}"
        for path in sorted((ROOT / "bench").glob("*.py"))
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("run_bench_")
    }
    assert runners == set(targets())


@pytest.mark.parametrize(
    "argv, target",
    [
        (["restore"], "bench.restore:run_bench_restore"),
        (["restore", "--api"], "bench.restore_api:run_bench_restore_api"),
        (["serve"], "bench.serve:run_bench_serve"),
        (["serve", "--against", "mlx-lm"], "bench.serve_against:run_bench_serve_against"),
        (["gui"], "bench.gui:run_bench_gui"),
        (["key-fairness"], "bench.key_fairness:run_bench_key_fairness"),
    ],
)
def test_a_bench_runs_its_target_with_the_parsed_arguments(monkeypatch, argv, target):
    ran = []
    monkeypatch.setattr(bench_command, "run_bench", lambda *call: ran.append(call) or 5)
    args = build_parser().parse_args(["bench", *argv])
    assert args.run(args) == 5
    assert ran == [(target, args)]


class WithoutBench:
    """A finder that finds no ``bench``, as where bench/ is not there."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "bench":
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@pytest.mark.parametrize("frozen", [True, False])
def test_without_the_benchmarks_a_bench_says_so_in_one_line(monkeypatch, capsys, frozen):
    """The packaged app (PyInstaller sets ``sys.frozen``) leaves bench/ out; a checkout
    installed before bench/ was one of its packages, run from elsewhere, does not see it."""
    for name in [m for m in sys.modules if m == "bench" or m.startswith("bench.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [WithoutBench(), *sys.meta_path])
    monkeypatch.setattr(sys, "frozen", frozen, raising=False)
    assert main(["bench", "multiturn", "--repeats", "1"]) == EXIT_USER_ERROR
    captured = capsys.readouterr()
    line = bench_command.NOT_PACKAGED if frozen else bench_command.NOT_INSTALLED
    assert captured.out == "" and captured.err == f"radixchat: error: {line}\n"
    assert "bench.multiturn" not in sys.modules


def test_a_module_missing_inside_the_benchmarks_is_not_taken_for_their_absence():
    with pytest.raises(ModuleNotFoundError) as missing:
        bench_command.run_bench("bench.no_such_bench:run", argparse.Namespace())
    assert missing.value.name == "bench.no_such_bench"
