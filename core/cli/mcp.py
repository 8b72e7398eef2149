"""``radixchat mcp``: list the MCP servers of ``mcp.json`` (``--tools``: started, with their
tools or errors), add one, remove one, enable or disable one (``core.mcp`` does the work,
as for the window)."""

from __future__ import annotations

import re
import sys
import time
from dataclasses import replace

from core import paths
from core.cli.terminal import safe
from core.errors import UserError
from core.mcp import config
from core.mcp.config import McpServer

NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def run_mcp(args) -> int:
    root = paths.data_dir(args.data_dir)
    servers = list(config.load_servers(root))
    command = args.mcp_command
    if command == "list":
        return _list(root, servers, args)
    if command == "add":
        return _add(root, servers, args)
    index = next((i for i, s in enumerate(servers) if s.name == args.name), None)
    if index is None:
        raise UserError(f"no MCP server named {args.name!r} in {paths.mcp_config_file(root)}")
    server = servers[index]
    if command == "rm":
        del servers[index]
        config.save_servers(root, servers)
        config.delete_secrets(server)
        print(f"removed {safe(server.name)}")
    else:
        servers[index] = replace(server, enabled=command == "enable")
        config.save_servers(root, servers)
        print(f"{safe(server.name)}: {command}d")
    return 0


def _list(root, servers: list[McpServer], args) -> int:
    if not servers:
        print(f"no MCP servers in {safe(paths.mcp_config_file(root))} (add one: radixchat mcp add)")
        return 0
    statuses = {}
    if args.tools:
        from core.mcp.hub import McpHub

        hub = McpHub(root, servers, start_timeout_s=args.timeout)
        hub.start()
        try:
            deadline = time.monotonic() + args.timeout + 1
            while time.monotonic() < deadline and any(
                s.state == "starting" for s in hub.statuses()
            ):
                time.sleep(0.05)
            statuses = {s.name: s for s in hub.statuses()}
        finally:
            hub.stop()
    for server in servers:
        flags = [server.kind, "enabled" if server.enabled else "disabled"]
        if server.allow_read_only:
            flags.append("read-only tools allowed")
        print(f"{safe(server.name)}  ({', '.join(flags)})  {safe(server.describe())}")
        status = statuses.get(server.name)
        if status is None or not server.enabled:
            continue
        if status.state != "ready":
            print(f"    {status.state}: {safe(status.error or 'no answer in time')}")
            if server.kind == "stdio":
                print(f"    log: {safe(hub.log_file(server.name))}")
            continue
        for tool in status.tools:
            mark = "  [read-only]" if tool.read_only else ""
            about = tool.description.split("\n")[0][:70]
            print(f"    {safe(tool.name)}{mark}  {safe(about)}")
    return 0


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise UserError(f"{flag} takes K=V, not {value!r}")
        out[key] = rest
    return out


def _add(root, servers: list[McpServer], args) -> int:
    if not NAME_OK.match(args.name):
        raise UserError(
            f"a server's name is letters, digits, _ . - (at most 64), not {args.name!r}"
        )
    command = args.command
    if bool(command) == bool(args.url):
        raise UserError("give either -- COMMAND ARGS... (a stdio server) or --url URL")
    if args.url and not args.url.startswith(("http://", "https://")):
        raise UserError(f"--url must be an http:// or https:// address, not {args.url!r}")
    if args.url and (args.env or args.secret_env):
        raise UserError("--env and --secret-env are for a command; an HTTP server takes --header")
    if command and (args.header or args.secret_header):
        raise UserError("--header is for an HTTP server (--url)")
    server = McpServer(
        args.name,
        command=command[0] if command else None,
        args=tuple(command[1:]),
        env=_pairs(args.env, "--env"),
        url=args.url,
        headers=_pairs(args.header, "--header"),
        enabled=not args.disabled,
        allow_read_only=args.allow_read_only,
    )
    in_file = []
    for values, flag, header in (
        (args.secret_env, "--secret-env", False),
        (args.secret_header, "--secret-header", True),
    ):
        for key, value in _pairs(values, flag).items():
            server, stored = config.with_secret(server, key, value, header=header)
            if not stored:
                in_file.append(key)
    replaced = any(s.name == server.name for s in servers)
    servers = [server if s.name == server.name else s for s in servers]
    if not replaced:
        servers.append(server)
    path = config.save_servers(root, servers)
    print(f"{'replaced' if replaced else 'added'} {safe(server.name)}: {safe(server.describe())}")
    if in_file:
        print(
            f"warning: no OS keychain here; {', '.join(in_file)} stays in {safe(path)} "
            "(readable by you only, mode 0600)",
            file=sys.stderr,
        )
    return 0
