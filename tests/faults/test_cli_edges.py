"""Command-line edges and hostile text: each is one line, exit 2, and nothing created;
what came from outside is printed with its control characters escaped."""

from __future__ import annotations

import os
import socket

import pytest

from core import paths
from core.chats.store import MAX_NAME_CHARS, ChatStore
from core.cli.main import main
from core.errors import StoreError
from kvcache.store import DiskStore, PageData

pytestmark = pytest.mark.faults

NOT_UTF8 = os.fsdecode(b"caf\xe9")  # what Python makes of argv bytes that are not UTF-8


def one_line_error(capsys, argv, *expected: str) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, captured
    assert len(err.splitlines()) == 1 and err.startswith("radixchat: error: "), err
    for text in expected:
        assert text in err
    return err


@pytest.mark.parametrize(
    "command",
    [["models"], ["chat", "hi"], ["cache", "stats"], ["chats", "verify"], ["fetch-model"]],
)
def test_a_data_dir_that_is_a_file(capsys, tmp_path, command):
    """Today: a FileExistsError traceback."""
    afile = tmp_path / "afile"
    afile.write_text("mine")
    one_line_error(
        capsys, [command[0], *command[1:], "--data-dir", str(afile)], "is a file, not a folder"
    )
    assert afile.read_text() == "mine"


def test_a_data_dir_under_a_file(capsys, tmp_path):
    (tmp_path / "afile").write_text("mine")
    one_line_error(
        capsys,
        ["models", "--data-dir", str(tmp_path / "afile" / "data")],
        "cannot create the data folder",
    )


@pytest.mark.parametrize(
    "command", [["cache", "verify"], ["cache", "stats"], ["cache", "clear"], ["chats", "verify"]]
)
def test_looking_at_a_missing_data_dir_creates_nothing(capsys, tmp_path, command):
    """Today: `cache verify` created the folder and a 576 KB database."""
    missing = tmp_path / "nonexistent"
    one_line_error(capsys, [*command, "--data-dir", str(missing)], "there is no data folder at")
    assert not missing.exists()


def test_a_cache_command_on_a_folder_without_a_cache_creates_nothing(capsys, tmp_path):
    assert main(["cache", "verify", "--data-dir", str(tmp_path)]) == 0
    assert "no KV cache at" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "name, expected",
    [
        (NOT_UTF8, "must be valid UTF-8 text"),  # today: a UnicodeEncodeError traceback
        ("\ud800", "must be valid UTF-8 text"),
        (
            "x" * (MAX_NAME_CHARS + 1),
            f"at most {MAX_NAME_CHARS} characters, not {MAX_NAME_CHARS + 1}",
        ),
        ("evil\x1b]0;pwned\x07", "cannot contain control characters"),
    ],
)
def test_a_bad_session_name_is_refused_before_anything_is_made(
    capsys, tmp_path, tiny_model, name, expected
):
    data = tmp_path / "data"
    err = one_line_error(
        capsys,
        ["chat", "--model", str(tiny_model), "--data-dir", str(data), "--session", name, "hi"],
        expected,
    )
    assert "\x1b" not in err
    assert not data.exists()


def test_a_session_name_with_a_lone_surrogate_is_never_stored(tmp_path):
    """Today: accepted, then failed to save (UnicodeEncodeError)."""
    with ChatStore(paths.chats_db_path(tmp_path)) as store:
        for name in ("bad\ud800name", "x" * (MAX_NAME_CHARS + 1)):
            with pytest.raises(StoreError):
                store.create_session(name)
            with pytest.raises(StoreError):
                store.get_or_create_session(name)
        assert store.list_sessions() == []
        assert store.create_session("y" * MAX_NAME_CHARS).name == "y" * MAX_NAME_CHARS


def test_a_prompt_that_is_not_utf8(capsys, tmp_path, tiny_model):
    """Today: 'internal error'."""
    data = tmp_path / "data"
    one_line_error(
        capsys,
        ["chat", "--model", str(tiny_model), "--data-dir", str(data), NOT_UTF8],
        "the message is not valid UTF-8 text (character 4)",
    )
    assert not data.exists()


def test_serve_on_a_busy_port_fails_before_the_model_loads(capsys, tmp_path):
    """Today: the model loaded first (or here: its error came first), then the bind failed."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        one_line_error(
            capsys,
            [
                "serve",
                "--port",
                str(port),
                "--model",
                str(tmp_path / "no-such-model"),
                "--data-dir",
                str(tmp_path / "data"),
            ],
            f"port {port} on 127.0.0.1 is in use",
        )
    assert not (tmp_path / "data").exists()


def test_cache_stats_escapes_names_from_outside(capsys, tmp_path):
    """Today: a session name sent through the API, "\\x1b]0;pwned\\x07", retitled the terminal."""
    with DiskStore(tmp_path / "kvcache.db") as store:
        store.save_session(
            "evil\x1b]0;pwned\x07\x9b31m", "model-a", [PageData((1, 2, 3), b"kv" * 8)]
        )
    assert main(["cache", "stats", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "evil\\x1b]0;pwned\\x07\\x9b31m" in out
    assert not any(c in out for c in "\x1b\x07\x9b")


def test_models_escapes_names_from_the_file_system(capsys, tmp_path):
    models = paths.models_dir(tmp_path)
    (models / "evil\x1b[2J.gguf").write_bytes(b"GGUF" + bytes(60))
    assert main(["models", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "evil\\x1b[2J" in out and "\x1b" not in out


def test_cache_clear_never_deletes_a_cache_another_process_is_writing(capsys, tmp_path):
    """Deleting the files is the full-disk way out only: a locked cache is in use."""
    import sqlite3

    path = tmp_path / "kvcache.db"
    with DiskStore(path) as store:
        store.save_session("s", "model-a", [PageData((1, 2, 3), b"kv" * 8)])
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        one_line_error(
            capsys, ["cache", "clear", "--data-dir", str(tmp_path)], "is locked by another"
        )
    finally:
        holder.close()
    with DiskStore(path) as store:
        assert store.session("s") is not None
