"""``radixchat --self-test``: one line, exit 0 when everything works, the broken stage named
otherwise, and nothing left behind."""

from __future__ import annotations

import re

import pytest

from core import paths
from core.cli.main import main

OK_LINE = re.compile(
    r"^radixchat self-test: ok · mlx \S+ \((cpu|gpu)[^)]*\) · "
    r"turn 1: (\d+) prompt tokens, 0 cached · "
    r"turn 2 after restart: (\d+) of (\d+) restored from disk · [\d.]+ s$"
)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A stand-in for the user's data folder: the self-test must not write into it."""
    home = tmp_path / "home"
    monkeypatch.setenv("RADIXCHAT_HOME", str(home))
    return home


def test_self_test_passes_with_one_line(capsys, home):
    assert main(["--self-test"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    match = OK_LINE.match(out[0])
    assert match, out[0]
    turn1_prompt, restored, turn2_prompt = (int(g) for g in match.groups()[1:])
    # turn 1's prompt and reply came back from disk
    assert 0 < turn1_prompt < restored < turn2_prompt
    assert not home.exists() or not any(home.iterdir())


def test_self_test_under_data_dir_cleans_up(capsys, tmp_path, home):
    target = tmp_path / "scratch"
    assert main(["--self-test", "--data-dir", str(target)]) == 0
    assert capsys.readouterr().out.startswith("radixchat self-test: ok")
    assert list(target.iterdir()) == []


def test_a_broken_disk_store_is_named(capsys, monkeypatch, home):
    import kvcache.tiered
    from kvcache.store import DiskStoreError

    def broken(*args, **kwargs):
        raise DiskStoreError("simulated: cannot open the cache database")

    monkeypatch.setattr(kvcache.tiered, "DiskTier", broken)
    assert main(["--self-test"]) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith("radixchat self-test: FAILED at disk save: disk cache off: ")
    assert "simulated" in line and "\n" not in line


def test_a_crashing_stage_is_named(capsys, monkeypatch, home):
    import core.models.tiny_model

    def boom(*args, **kwargs):
        raise OSError("simulated\nmulti-line failure")

    monkeypatch.setattr(core.models.tiny_model, "write_tiny_model", boom)
    assert main(["--self-test"]) == 1
    assert (
        capsys.readouterr().out
        == "radixchat self-test: FAILED at tiny model: OSError: simulated multi-line failure\n"
    )


def test_a_model_that_does_not_load_is_named(capsys, monkeypatch, home, tmp_path):
    import core.models.tiny_model

    monkeypatch.setattr(
        core.models.tiny_model, "write_tiny_model", lambda path, spec: tmp_path / "missing"
    )
    assert main(["--self-test"]) == 1
    assert capsys.readouterr().out.startswith(
        "radixchat self-test: FAILED at engine start: UserError: "
    )


def test_the_user_data_folder_is_never_resolved(capsys, monkeypatch, home):
    def forbidden(*args, **kwargs):
        raise AssertionError("the self-test asked for the user's data folder")

    monkeypatch.setattr(paths, "data_dir", forbidden)
    assert main(["--self-test"]) == 0
