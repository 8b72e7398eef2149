"""``radixchat serve``: the HTTP API on the engine until Ctrl-C (or SIGTERM)."""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from core import paths
from core.api.connections import ConnectionLimits
from core.api.guard import normalize_origin
from core.api.limits import RequestLimits
from core.api.server import ApiServer, check_bind
from core.cli.commands.options import engine_config_of
from core.cli.progress import print_progress
from core.cli.terminal import safe
from core.engine.engine import Engine
from core.errors import UserError
from core.limits import (
    MAX_CONNECTIONS,
    MAX_OUTPUT_TOKENS,
    MAX_SCHEMA_BYTES,
    MAX_TOOLS,
)


def run_serve(args) -> int:
    """``radixchat serve``: load the model, serve until Ctrl-C (or SIGTERM), shut down cleanly."""
    api_key, origins = check_serve_args(args)
    root = paths.data_dir(args.data_dir)
    config = engine_config_of(args)
    engine = Engine(root, args.model, config=config, on_load_progress=print_progress).start()
    return serve_engine(engine, args, api_key, origins)


def check_serve_args(args) -> tuple[list[str], list[str]]:
    """The API keys and the allowed origins; what cannot work refused before any model loads."""
    api_key = api_keys_of(args)
    check_bind(args.host, api_key)  # before the model loads
    origins = list(args.allow_origin or ())
    for origin in origins:
        try:
            normalize_origin(origin)
        except ValueError as exc:
            raise UserError(f"--allow-origin: {exc}") from None
    # likewise: a busy port fails in a moment, not after the load
    check_port_free(args.host, args.port)
    ollama_port = getattr(args, "ollama_port", None)
    if ollama_port is not None:
        if ollama_port == args.port and ollama_port != 0:
            raise UserError(f"--ollama-port {ollama_port} is the --port: give another")
        check_port_free(args.host, ollama_port, "--ollama-port")
    return api_key, origins


def serve_engine(
    engine: Engine, args, api_key: list[str], origins: list[str], what: str = ""
) -> int:
    """Serve the API on a started ``engine`` until Ctrl-C (or SIGTERM); shut it down."""
    server = None
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        info = engine.wait_ready()
        connections = ConnectionLimits(getattr(args, "max_connections", None) or MAX_CONNECTIONS)
        server = ApiServer(
            engine,
            args.host,
            args.port,
            api_key=api_key,
            allow_origins=origins,
            limits=request_limits(args),
            connections=connections,
            aliases=getattr(args, "alias", None) or (),
            ollama_port=getattr(args, "ollama_port", None),
        ).start()
        print(
            f"radixchat: serving {safe(info.name)}{what} at {server.address}/v1 (Ctrl-C to stop)",
            file=sys.stderr,
            flush=True,
        )
        if server.ollama_address is not None:
            print(
                f"radixchat: Ollama's clients: {server.ollama_address}",
                file=sys.stderr,
                flush=True,
            )
        threading.Event().wait()
    except KeyboardInterrupt:
        print("radixchat: stopping", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if server is not None:
            server.stop()
        engine.shutdown()
    return 0


def request_limits(args) -> RequestLimits:
    """What one request may bring (``--max-tools``, ``--max-schema-bytes``) and its reply's
    tokens when it sets no limit (``--max-output-tokens``)."""
    output = getattr(args, "max_output_tokens", None)
    return RequestLimits(
        getattr(args, "max_tools", None) or MAX_TOOLS,
        getattr(args, "max_schema_bytes", None) or MAX_SCHEMA_BYTES,
        MAX_OUTPUT_TOKENS if output is None else output,
    )


def api_keys_of(args) -> list[str]:
    """The keys of ``--api-key`` (repeatable) and ``--api-keys-file``, else $RADIXCHAT_API_KEY.
    Each key is a client of its own, with its own cache namespace."""
    keys = [key.strip() for key in args.api_key or () if key.strip()]
    if getattr(args, "api_keys_file", None):
        try:
            text = Path(args.api_keys_file).read_text(encoding="utf-8")
        except (OSError, UnicodeError) as exc:
            raise UserError(f"cannot read the API keys file {args.api_keys_file}: {exc}") from None
        keys += [
            line.strip()
            for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
        if not keys:
            raise UserError(f"the API keys file {args.api_keys_file} holds no key")
    if not keys and os.environ.get("RADIXCHAT_API_KEY"):
        keys = [os.environ["RADIXCHAT_API_KEY"]]
    if any(any(c.isspace() for c in key) for key in keys):
        raise UserError("an API key may not contain spaces")
    return list(dict.fromkeys(keys))


def check_port_free(host: str, port: int, option: str = "--port") -> None:
    """Refuse, with one line, an address the server could not bind: a port in use, an
    address not on this machine. Binds a socket the way the server will, then lets it go."""
    if port == 0:
        return  # any free port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UserError(f"cannot serve on {host}: {exc.strerror}") from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does
        try:
            probe.bind(address)
        except OSError as exc:
            reason = (
                "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be used ({exc.strerror})"
            )
            raise UserError(
                f"port {port} on {host} {reason}; stop what holds it or give another {option}"
            ) from exc


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
