"""``radixchat cache clear --session NAME`` finds a chat's cache in the app's namespace."""

from __future__ import annotations

from core import paths
from core.cli.main import main
from kvcache.store import DiskStore, PageData, session_row


def test_clearing_a_chat_by_its_name(tmp_path, capsys):
    with DiskStore(paths.kv_cache_db_path(tmp_path)) as store:
        for name in (session_row("trip", "app"), session_row("trip", "api")):
            store.save_session(name, "fp", [PageData((1, 2, 3), b"kv" * 100)], namespace=name.split("/")[0])
    assert main(["cache", "clear", "--session", "trip", "--data-dir", str(tmp_path)]) == 0
    assert "cleared the cache of session trip" in capsys.readouterr().out
    with DiskStore(paths.kv_cache_db_path(tmp_path)) as store:
        assert [s.name for s in store.sessions()] == ["api/trip"]  # an API client's "trip" is not the chat
