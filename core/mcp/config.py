"""The MCP servers a user set up: ``mcp.json`` in the data folder, and their secrets.

The file has the format LM Studio, Claude Desktop, Cursor and Jan read, so a user can copy
theirs::

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem",
                  "/tmp"], "env": {"TOKEN": "keyring:"}},
        "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "keyring:"}},
        "off": {"command": "uvx", "args": ["some-server"], "disabled": true,
                "allowReadOnly": true}}}

Besides the common keys, an entry may say ``"disabled": true`` (not started) and
``"allowReadOnly": true`` (the window runs the server's read-only tools, as the MCP tool
annotations' ``readOnlyHint`` marks them, without asking). Keys RadixChat does not know, in
an entry or beside ``mcpServers``, are kept when the file is written back.

Secrets: an env or header value of ``"keyring:"`` lives in the OS keychain (the ``keyring``
package) under the service ``radixchat-mcp`` and the user name ``NAME/VAR`` (a header:
``NAME/header/KEY``). Where no keychain is usable (a headless Linux) the value stays in the
file, which is written readable by its owner only (0600) in any case.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core import paths
from core.errors import UserError

KEYRING_SERVICE = "radixchat-mcp"
KEYRING_VALUE = "keyring:"  # the value in the file of a secret kept in the keychain
_KNOWN_KEYS = ("command", "args", "env", "url", "headers", "disabled", "allowReadOnly")


@dataclass(frozen=True)
class McpServer:
    """One entry of ``mcp.json``: a stdio server (``command``) or an HTTP one (``url``)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    enabled: bool = True
    allow_read_only: bool = False

    @property
    def kind(self) -> str:
        """``"stdio"`` or ``"http"``."""
        return "http" if self.url else "stdio"

    def describe(self) -> str:
        """The command line or the URL, for a listing."""
        if self.url:
            return self.url
        return " ".join([self.command or "", *self.args])


def load_servers(root: Path) -> tuple[McpServer, ...]:
    """The servers of ``mcp.json`` in the data folder ``root``, in the file's order (no file:
    none). A file that is not JSON, or an entry that is not a server, is a one-line
    :class:`UserError` naming the file and the entry."""
    path = paths.mcp_config_file(root)
    document = _read(path)
    return tuple(_parse_entry(path, name, entry) for name, entry in document["mcpServers"].items())


def save_servers(root: Path, servers: Iterable[McpServer]) -> Path:
    """Write ``servers`` as ``mcp.json`` (atomically: a temporary file, then a rename; mode
    0600). Keys the user's file had that RadixChat does not know are kept."""
    path = paths.mcp_config_file(root)
    try:
        old = _read(path)
    except UserError:  # a damaged file is replaced whole
        old = {"mcpServers": {}}
    document = {key: value for key, value in old.items() if key != "mcpServers"}
    entries: dict[str, Any] = {}
    for server in servers:
        previous = old["mcpServers"].get(server.name)
        entry = {
            key: value
            for key, value in (previous.items() if isinstance(previous, dict) else ())
            if key not in _KNOWN_KEYS
        }
        entries[server.name] = _entry(server) | entry
    document["mcpServers"] = entries
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=".mcp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o600)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def _entry(server: McpServer) -> dict[str, Any]:
    if server.url:
        entry: dict[str, Any] = {"url": server.url}
        if server.headers:
            entry["headers"] = dict(server.headers)
    else:
        entry = {"command": server.command, "args": list(server.args)}
        if server.env:
            entry["env"] = dict(server.env)
    if not server.enabled:
        entry["disabled"] = True
    if server.allow_read_only:
        entry["allowReadOnly"] = True
    return entry


def _read(path: Path) -> dict[str, Any]:
    where = paths.safe_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {"mcpServers": {}}
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {where}: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        document = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise UserError(f"{where} is not JSON: {exc.msg} (line {exc.lineno})") from exc
    if not isinstance(document, dict):
        raise UserError(f"{where} must hold a JSON object with an mcpServers object")
    servers = document.setdefault("mcpServers", {})
    if not isinstance(servers, dict):
        raise UserError(f'{where}: "mcpServers" must be an object of servers by name')
    return document


def _parse_entry(path: Path, name: str, entry: Any) -> McpServer:
    def bad(why: str) -> UserError:
        return UserError(f"{paths.safe_path(path)}: server {name!r}: {why}")

    if not name.strip():
        raise bad("a server needs a name")
    if not isinstance(entry, dict):
        raise bad("must be an object with a command or a url")
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise bad('needs either "command" (a stdio server) or "url" (an HTTP one)')
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise bad('"command" must be a non-empty string')
    if url is not None and (
        not isinstance(url, str) or not url.startswith(("http://", "https://"))
    ):
        raise bad('"url" must be an http:// or https:// address')
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise bad('"args" must be a list of strings')
    env, headers = (_string_map(entry, key, bad) for key in ("env", "headers"))
    flags = {}
    for key in ("disabled", "allowReadOnly"):
        flags[key] = entry.get(key, False)
        if not isinstance(flags[key], bool):
            raise bad(f'"{key}" must be true or false')
    return McpServer(
        name=name,
        command=command,
        args=tuple(args),
        env=env,
        url=url,
        headers=headers,
        enabled=not flags["disabled"],
        allow_read_only=flags["allowReadOnly"],
    )


def _string_map(entry: dict, key: str, bad) -> dict[str, str]:
    value = entry.get(key, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise bad(f'"{key}" must be an object of strings')
    return dict(value)


# -- secrets in the OS keychain --


def keyring_usable() -> bool:
    """Whether ``keyring`` has a real backend here (not the failing one a headless Linux
    gets, nor a chain of none)."""
    import keyring
    from keyring.backends import chainer, fail

    backend = keyring.get_keyring()
    if isinstance(backend, fail.Keyring):
        return False
    return not (isinstance(backend, chainer.ChainerBackend) and not backend.backends)


def secret_user(server: str, key: str, *, header: bool = False) -> str:
    """The keychain user name of a server's env variable (``NAME/VAR``) or header
    (``NAME/header/KEY``)."""
    return f"{server}/header/{key}" if header else f"{server}/{key}"


def with_secret(
    server: McpServer, key: str, value: str, *, header: bool = False
) -> tuple[McpServer, bool]:
    """``server`` with the env variable (or header) ``key`` set to a secret ``value``: in the
    keychain where one is usable (the entry then says ``"keyring:"``; returns True), else in
    the entry itself (returns False: the file, written 0600, holds it)."""
    import keyring
    from keyring.errors import KeyringError

    stored = False
    if keyring_usable():
        try:
            keyring.set_password(
                KEYRING_SERVICE, secret_user(server.name, key, header=header), value
            )
            stored = True
        except KeyringError:
            stored = False
    kept = KEYRING_VALUE if stored else value
    if header:
        return replace(server, headers={**server.headers, key: kept}), stored
    return replace(server, env={**server.env, key: kept}), stored


def delete_secrets(server: McpServer) -> None:
    """Remove the server's secrets from the keychain (when it is removed)."""
    import keyring
    from keyring.errors import KeyringError

    if not keyring_usable():
        return
    for values, header in ((server.env, False), (server.headers, True)):
        for key, value in values.items():
            if value == KEYRING_VALUE:
                try:
                    keyring.delete_password(
                        KEYRING_SERVICE, secret_user(server.name, key, header=header)
                    )
                except KeyringError:
                    pass  # already gone


def resolved_env(server: McpServer) -> dict[str, str]:
    """The server's env with its keychain secrets read back (a missing one: UserError)."""
    return _resolve(server, server.env, header=False)


def resolved_headers(server: McpServer) -> dict[str, str]:
    """The server's headers with their keychain secrets read back (a missing one: UserError)."""
    return _resolve(server, server.headers, header=True)


def _resolve(server: McpServer, values: dict[str, str], *, header: bool) -> dict[str, str]:
    if KEYRING_VALUE not in values.values():
        return dict(values)
    import keyring
    from keyring.errors import KeyringError

    out = {}
    for key, value in values.items():
        if value == KEYRING_VALUE:
            user = secret_user(server.name, key, header=header)
            try:
                value = keyring.get_password(KEYRING_SERVICE, user)
            except KeyringError as exc:
                raise UserError(f"cannot read the secret {user} from the keychain: {exc}") from exc
            if value is None:
                raise UserError(
                    f"the secret {user} is not in the keychain ({KEYRING_SERVICE}); set it again: "
                    f"radixchat mcp add {server.name} --secret-{'header' if header else 'env'} "
                    f"{key}=VALUE ..."
                )
        out[key] = value
    return out
