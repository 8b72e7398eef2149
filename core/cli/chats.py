"""``radixchat chats verify``: list the chat rows that do not read back whole."""

from __future__ import annotations

import json
from dataclasses import asdict

from core import paths
from core.chats.store import ChatStore
from core.cli.terminal import safe
from core.errors import UserError


def run_chats(args) -> int:
    root = paths.data_dir(args.data_dir, create=False)
    path = paths.chats_db_path(root)
    if not path.exists():
        raise UserError(f"no chat history at {path}")
    with ChatStore(path) as store:
        damage = store.verify()
    if args.json:
        print(json.dumps({"path": str(path), "damaged": [asdict(d) for d in damage]}))
    else:
        for item in damage:
            print(safe(item))
        print(f"{safe(path)}: " + (f"{len(damage)} damaged" if damage else "clean"))
    return 1 if damage else 0
