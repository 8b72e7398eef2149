"""``radixchat mcp list|add|rm|enable|disable``: mcp.json from the command line, the
servers' tools (started) or errors, one-line errors with exit 2."""

from __future__ import annotations

import json
import sys

import pytest

from core import paths
from core.cli.main import main
from core.mcp.config import load_servers
from tests.core.mcp import mcp_fixtures
from tests.core.mcp.mcp_fixtures import TOOLS_SERVER

memory_keyring, no_keyring = mcp_fixtures.memory_keyring, mcp_fixtures.no_keyring  # the fixtures


def run(capsys, data, *argv) -> tuple[int, str, str]:
    code = main(["--data-dir", str(data), "mcp", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_add_list_enable_disable_rm(capsys, tmp_path, memory_keyring):
    code, out, _ = run(
        capsys, tmp_path, "add", "fs", "--env", "A=1", "--secret-env", "TOKEN=s3", "--",
        "npx", "-y", "@modelcontextprotocol/server-filesystem", "/tmp",
    )  # fmt: skip
    assert code == 0 and out == "added fs: npx -y @modelcontextprotocol/server-filesystem /tmp\n"
    code, out, _ = run(
        capsys, tmp_path, "add", "--allow-read-only", "web", "--url", "https://h/mcp",
        "--header", "X-A=1", "--disabled",
    )  # fmt: skip
    assert code == 0
    (fs, web) = load_servers(tmp_path)
    assert fs.args == ("-y", "@modelcontextprotocol/server-filesystem", "/tmp")
    assert fs.env == {"A": "1", "TOKEN": "keyring:"}
    assert memory_keyring.items == {("radixchat-mcp", "fs/TOKEN"): "s3"}
    assert (web.url, web.headers, web.enabled, web.allow_read_only) == (
        "https://h/mcp", {"X-A": "1"}, False, True,
    )  # fmt: skip
    assert run(capsys, tmp_path, "disable", "fs")[1] == "fs: disabled\n"
    assert run(capsys, tmp_path, "enable", "web")[1] == "web: enabled\n"
    code, out, _ = run(capsys, tmp_path, "list")
    assert out.splitlines() == [
        "fs  (stdio, disabled)  npx -y @modelcontextprotocol/server-filesystem /tmp",
        "web  (http, enabled, read-only tools allowed)  https://h/mcp",
    ]
    assert run(capsys, tmp_path, "rm", "fs")[1] == "removed fs\n"
    assert memory_keyring.items == {}
    assert [s.name for s in load_servers(tmp_path)] == ["web"]


def test_a_secret_without_a_keychain_warns(capsys, tmp_path, no_keyring):
    code, _, err = run(capsys, tmp_path, "add", "gh", "--secret-env", "TOKEN=s3", "--", "srv")
    assert code == 0 and "warning: no OS keychain here; TOKEN stays in" in err
    assert json.loads(paths.mcp_config_file(tmp_path).read_text())["mcpServers"]["gh"]["env"] == {
        "TOKEN": "s3"
    }


@pytest.mark.parametrize(
    "argv, words",
    [
        (("add", "x"), "give either -- COMMAND"),
        (("add", "x", "--url", "https://h", "--", "srv"), "give either -- COMMAND"),
        (("add", "x", "--url", "ftp://h"), "--url must be an http"),
        (("add", "x", "--env", "A", "--", "srv"), "--env takes K=V"),
        (("add", "a/b", "--", "srv"), "a server's name is"),
        (("add", "x", "--header", "A=1", "--", "srv"), "--header is for an HTTP server"),
        (("rm", "nobody"), "no MCP server named 'nobody'"),
        (("enable", "nobody"), "no MCP server named 'nobody'"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, argv, words):
    code, out, err = run(capsys, tmp_path, *argv)
    assert code == 2 and out == "" and words in err and err.count("\n") == 1


def test_a_malformed_file_is_one_line(capsys, tmp_path):
    paths.mcp_config_file(tmp_path).write_text('{"mcpServers": {"a": {"args": []}}}')
    code, _, err = run(capsys, tmp_path, "list")
    assert code == 2 and "mcp.json: server 'a': needs either" in err


def test_list_tools_starts_the_servers(capsys, tmp_path):
    assert run(capsys, tmp_path, "list")[1].startswith("no MCP servers in ")
    run(capsys, tmp_path, "add", "t", "--", sys.executable, str(TOOLS_SERVER))
    run(capsys, tmp_path, "add", "broken", "--", sys.executable, "-c", "raise SystemExit(7)")
    code, out, _ = run(capsys, tmp_path, "list", "--tools", "--timeout", "20")
    lines = out.splitlines()
    assert code == 0 and lines[0] == f"t  (stdio, enabled)  {sys.executable} {TOOLS_SERVER}"
    assert "    read_clock  [read-only]  Now." in lines and "    add  Add two integers." in lines
    assert "    failed: the server exited with code 7" in lines
    assert f"    log: {tmp_path / 'logs' / 'mcp-broken.log'}" in lines
