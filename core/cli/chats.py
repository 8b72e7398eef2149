"""``radixchat chats``: ``verify`` lists the chat rows that do not read back whole; ``export``
writes a chat as Markdown or JSON; ``import`` makes a new chat of a JSON one
(``core.chats.transfer`` does the work, as for the window)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from core import paths
from core.chats import transfer
from core.chats.store import ChatStore
from core.cli.terminal import safe, safe_json, safe_text
from core.errors import UserError


def run_chats(args) -> int:
    root = paths.data_dir(args.data_dir, create=args.chats_command == "import")
    path = paths.chats_db_path(root)
    if args.chats_command != "import" and not path.exists():
        raise UserError(f"no chat history at {path}")
    with ChatStore(path) as store:
        if args.chats_command == "export":
            return _export(store, args)
        if args.chats_command == "import":
            return _import(store, args)
        damage = store.verify()
    if args.json:
        print(json.dumps({"path": str(path), "damaged": [asdict(d) for d in damage]}))
    else:
        for item in damage:
            print(safe(item))
        print(f"{safe(path)}: " + (f"{len(damage)} damaged" if damage else "clean"))
    return 1 if damage else 0


def _export(store: ChatStore, args) -> int:
    session = store.get_session(args.chat)
    if session is None:
        raise UserError(f"no chat named {args.chat!r} in {store.path}")
    if args.output:
        kind = transfer.write_export(store, session.id, Path(args.output), args.format)
        print(f"wrote {safe(session.title or session.name)} to {safe(args.output)} ({kind})")
    elif (args.format or "markdown") == "json":
        print(safe_json(transfer.export_json(store, session.id), indent=2))
    else:  # to a terminal: control characters escaped (a file written with -o keeps them)
        sys.stdout.write(safe_text(transfer.export_markdown(store, session.id)))
    return 0


def _import(store: ChatStore, args) -> int:
    done = transfer.import_chat(store, transfer.read_export(Path(args.file)), args.title)
    if args.json:
        print(
            json.dumps(
                {"name": done.session.name, "id": done.session.id, "messages": done.messages}
            )
        )
    else:
        print(
            f"imported {safe(done.session.title or done.session.name)} as chat "
            f"{safe(done.session.name)}: {done.messages} messages (its cache is built on the "
            "first reply: radixchat chat --session NAME)"
        )
    return 0
