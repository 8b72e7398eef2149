"""``radixchat serve``: the HTTP API on the engine until Ctrl-C (or SIGTERM)."""

from __future__ import annotations

import os
import signal
import sys
import threading

from core import paths
from core.api.guard import normalize_origin
from core.api.server import ApiServer, check_bind
from core.cli.progress import print_progress
from core.engine.engine import Engine
from core.errors import UserError


def run_serve(args) -> int:
    """``radixchat serve``: load the model, serve until Ctrl-C (or SIGTERM), shut down cleanly."""
    api_key = args.api_key or os.environ.get("RADIXCHAT_API_KEY") or None
    check_bind(args.host, api_key)  # before the model loads
    origins = list(args.allow_origin or ())
    for origin in origins:
        try:
            normalize_origin(origin)
        except ValueError as exc:
            raise UserError(f"--allow-origin: {exc}") from None
    root = paths.data_dir(args.data_dir)
    engine = Engine(root, args.model, pool_tokens=args.kv_tokens, on_load_progress=print_progress).start()
    server = None
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        info = engine.wait_ready()
        server = ApiServer(engine, args.host, args.port, api_key=api_key, allow_origins=origins).start()
        print(f"radixchat: serving {info.name} at {server.address}/v1 (Ctrl-C to stop)",
              file=sys.stderr, flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        print("radixchat: stopping", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if server is not None:
            server.stop()
        engine.shutdown()
    return 0


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
