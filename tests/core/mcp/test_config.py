"""mcp.json: reading, writing back (unknown keys kept, 0600, atomic), errors, secrets."""

from __future__ import annotations

import json
import stat

import pytest

from core import paths
from core.errors import UserError
from core.mcp import config
from core.mcp.config import McpServer, load_servers, resolved_env, save_servers, with_secret


def write(root, document) -> None:
    paths.mcp_config_file(root).write_text(
        document if isinstance(document, str) else json.dumps(document)
    )


def test_missing_file_is_no_servers(tmp_path):
    assert load_servers(tmp_path) == ()


def test_claude_desktop_file_reads_and_round_trips(tmp_path):
    write(
        tmp_path,
        {
            "globalShortcut": "Ctrl+Space",
            "mcpServers": {
                "files": {
                    "command": "npx",
                    "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                    "env": {"DEBUG": "1"},
                    "type": "stdio",
                },
                "remote": {
                    "url": "https://example.com/mcp",
                    "headers": {"X-Key": "k"},
                    "disabled": True,
                    "allowReadOnly": True,
                },
            },
        },
    )
    files, remote = load_servers(tmp_path)
    assert files == McpServer(
        "files",
        command="npx",
        args=("-y", "@modelcontextprotocol/server-filesystem", "/tmp"),
        env={"DEBUG": "1"},
    )
    assert (files.kind, remote.kind) == ("stdio", "http")
    assert remote.url == "https://example.com/mcp" and remote.headers == {"X-Key": "k"}
    assert not remote.enabled and remote.allow_read_only
    save_servers(tmp_path, (files, McpServer("new", command="uvx", args=("srv",)), remote))
    document = json.loads(paths.mcp_config_file(tmp_path).read_text())
    assert document["globalShortcut"] == "Ctrl+Space"  # unknown keys kept
    assert document["mcpServers"]["files"]["type"] == "stdio"
    assert list(document["mcpServers"]) == ["files", "new", "remote"]
    assert document["mcpServers"]["remote"]["disabled"] is True
    assert "disabled" not in document["mcpServers"]["files"]
    assert load_servers(tmp_path) == (files, McpServer("new", command="uvx", args=("srv",)), remote)
    mode = stat.S_IMODE(paths.mcp_config_file(tmp_path).stat().st_mode)
    assert mode == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["mcp.json"]  # no temporary file left


@pytest.mark.parametrize(
    "document, words",
    [
        ("{not json", "is not JSON"),
        ("[]", "must hold a JSON object"),
        ({"mcpServers": []}, '"mcpServers" must be an object'),
        ({"mcpServers": {"a": "npx"}}, "server 'a': must be an object"),
        ({"mcpServers": {"a": {}}}, "server 'a': needs either"),
        ({"mcpServers": {"a": {"command": "x", "url": "http://h"}}}, "needs either"),
        ({"mcpServers": {"a": {"command": "x", "args": "y"}}}, '"args" must be a list'),
        ({"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}, '"env" must be an object'),
        ({"mcpServers": {"b": {"url": "ftp://h"}}}, "server 'b': \"url\" must be an http"),
        ({"mcpServers": {"a": {"command": "x", "disabled": "yes"}}}, '"disabled" must be'),
    ],
)
def test_malformed_file_is_one_line_naming_file_and_entry(tmp_path, document, words):
    write(tmp_path, document)
    with pytest.raises(UserError) as error:
        load_servers(tmp_path)
    message = str(error.value)
    assert "mcp.json" in message and words in message and "\n" not in message


def test_a_secret_goes_to_the_keychain(tmp_path, memory_keyring):
    server, stored = with_secret(McpServer("gh", command="srv"), "TOKEN", "s3cret")
    assert stored and server.env == {"TOKEN": "keyring:"}
    assert memory_keyring.items == {("radixchat-mcp", "gh/TOKEN"): "s3cret"}
    api, _ = with_secret(
        McpServer("api", url="http://h/mcp"), "Authorization", "Bearer x", header=True
    )
    save_servers(tmp_path, [server, api])
    assert "s3cret" not in paths.mcp_config_file(tmp_path).read_text()
    loaded, api = load_servers(tmp_path)
    assert resolved_env(loaded) == {"TOKEN": "s3cret"}
    assert api.headers == {"Authorization": "keyring:"}
    assert config.resolved_headers(api) == {"Authorization": "Bearer x"}
    config.delete_secrets(loaded)
    config.delete_secrets(api)
    assert memory_keyring.items == {}
    with pytest.raises(UserError, match="gh/TOKEN is not in the keychain"):
        resolved_env(loaded)


def test_without_a_keychain_the_secret_stays_in_the_0600_file(tmp_path, no_keyring):
    assert not config.keyring_usable()
    server, stored = with_secret(McpServer("gh", command="srv"), "TOKEN", "s3cret")
    assert not stored and server.env == {"TOKEN": "s3cret"}
    save_servers(tmp_path, [server])
    path = paths.mcp_config_file(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert resolved_env(load_servers(tmp_path)[0]) == {"TOKEN": "s3cret"}


def test_a_damaged_file_is_replaced_on_save(tmp_path):
    write(tmp_path, "{broken")
    save_servers(tmp_path, [McpServer("a", command="x")])
    assert load_servers(tmp_path) == (McpServer("a", command="x"),)
