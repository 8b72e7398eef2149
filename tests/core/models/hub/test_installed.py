"""Downloaded models: listed with size and last use, deleted with their cached KV only."""

from __future__ import annotations

import pytest

from core import paths
from core.errors import UserError
from core.models import usage
from core.models.hub import download, hf_cache, installed
from kvcache.store import DiskStore
from kvcache.store_format import PageData
from tests.core.models.hub.hub_fixture import BIG_MLX, OTHER_MLX, TINY_MLX, TWO_GGUF


def _save_sessions(root, sessions: dict[str, str]) -> None:
    with DiskStore(paths.kv_cache_db_path(root)) as store:
        for name, fingerprint in sessions.items():
            store.save_session(
                name, fingerprint, [PageData((1, 2, 3, 4), b"k" * 512), PageData((5,), b"v" * 128)]
            )


def test_list_with_size_and_last_use(loopback_hub, tmp_path):
    tiny = download.pull(TINY_MLX, data_root=tmp_path)
    gguf = download.pull(f"{TWO_GGUF}:tiny-Q8_0.gguf", data_root=tmp_path)
    usage.record_use(tmp_path, tiny.path, TINY_MLX, "fp-tiny", now=1_000.0)
    usage.record_use(tmp_path, tiny.path, TINY_MLX, "fp-tiny-f16", now=2_000.0)
    models = {m.spec: m for m in installed.installed_models(tmp_path)}
    assert set(models) == {TINY_MLX, gguf.spec}
    assert models[TINY_MLX].size_bytes == tiny.total_bytes and models[TINY_MLX].last_used == 2_000.0
    assert models[gguf.spec].size_bytes == gguf.total_bytes and models[gguf.spec].last_used is None
    assert usage.read_uses(tmp_path)[str(tiny.path)].fingerprints == ("fp-tiny", "fp-tiny-f16")


def test_loading_records_the_use(loopback_hub, tmp_path):
    from core.models.load.loader import load_model

    download.pull(TINY_MLX, data_root=tmp_path)
    info = load_model(TINY_MLX, tmp_path).info
    (use,) = usage.uses_under(tmp_path, hf_cache.repo_folder(TINY_MLX))
    assert use.spec == TINY_MLX and use.fingerprints == (info.fingerprint,)
    assert installed.find(tmp_path, TINY_MLX).last_used == use.last_used


def test_delete_takes_the_models_kv_cache_and_leaves_the_others(loopback_hub, tmp_path):
    tiny = download.pull(TINY_MLX, data_root=tmp_path)
    other = download.pull(OTHER_MLX, data_root=tmp_path)
    usage.record_use(tmp_path, tiny.path, TINY_MLX, "fp-tiny")
    usage.record_use(tmp_path, other.path, OTHER_MLX, "fp-other")
    _save_sessions(tmp_path, {"chat-a": "fp-tiny", "chat-b": "fp-tiny", "chat-c": "fp-other"})

    deleted = installed.delete_model(tmp_path, TINY_MLX)
    assert (
        deleted.kv_sessions == 2
        and deleted.kv_bytes > 0
        and deleted.freed_bytes >= tiny.total_bytes
    )
    assert not hf_cache.repo_folder(TINY_MLX).exists()
    with DiskStore(paths.kv_cache_db_path(tmp_path)) as store:
        assert [s.name for s in store.sessions()] == ["chat-c"]
    assert [m.spec for m in installed.installed_models(tmp_path)] == [OTHER_MLX]
    assert usage.uses_under(tmp_path, hf_cache.repo_folder(TINY_MLX)) == []
    with pytest.raises(UserError, match="no downloaded model"):
        installed.delete_model(tmp_path, TINY_MLX)


def test_delete_one_gguf_file_keeps_the_other(loopback_hub, tmp_path):
    q8 = download.pull(f"{TWO_GGUF}:tiny-Q8_0.gguf", data_root=tmp_path)
    f16 = download.pull(f"{TWO_GGUF}:tiny-F16.gguf", data_root=tmp_path)
    deleted = installed.delete_model(tmp_path, q8.spec)
    assert deleted.freed_bytes == q8.total_bytes
    assert [m.spec for m in installed.installed_models(tmp_path)] == [f16.spec]
    installed.delete_model(tmp_path, f16.spec)  # the last file: the repo folder goes
    assert not hf_cache.repo_folder(TWO_GGUF).exists()


def test_a_partial_download_can_be_deleted(loopback_hub, tmp_path):
    import threading

    cancel = threading.Event()
    loopback_hub.rate = 50e6  # the cancel lands mid-file
    with pytest.raises(download.DownloadCancelled):
        download.pull(
            BIG_MLX,
            data_root=tmp_path,
            cancel=cancel,
            progress=lambda p: cancel.set() if p.fetched_bytes > 1 << 20 else None,
        )
    (partial,) = installed.partial_downloads()
    assert partial.repo_id == BIG_MLX and partial.bytes > 0
    installed.delete_model(tmp_path, BIG_MLX)
    assert installed.partial_downloads() == []


def test_an_unreadable_usage_file_costs_only_history(tmp_path):
    (tmp_path / usage.USAGE_FILE).write_text("{not json")
    assert usage.read_uses(tmp_path) == {}
    usage.record_use(tmp_path, tmp_path / "m", "m", "fp")
    assert usage.read_uses(tmp_path)[str(tmp_path / "m")].fingerprints == ("fp",)
