"""Pulling models from the loopback hub: only the needed files, into the HF cache,
resumed after a cancel or a dropped connection, verified, loadable at once."""

from __future__ import annotations

import hashlib
import json
import os
import threading

import pytest

from core.models.hub import client, download, hf_cache, installed
from core.models.hub.client import HubError
from core.models.hub.download import DownloadCancelled
from core.models.local import list_local_models
from tests.core.models.hub.hub_fixture import (
    BERT_MLX,
    BIG_MLX,
    GATED,
    GOOD_TOKEN,
    TINY_MLX,
    TWO_GGUF,
)

WEIGHTS = "model.safetensors"


def _blobs(repo_id: str) -> list[str]:
    return sorted(p.name for p in (hf_cache.repo_folder(repo_id) / "blobs").iterdir())


def test_pull_fetches_only_what_a_model_needs(loopback_hub, tmp_path):
    seen = []
    result = download.pull(TINY_MLX, data_root=tmp_path, progress=seen.append)
    repo = loopback_hub.repos[TINY_MLX]
    assert result.spec == TINY_MLX and result.path == hf_cache.resolve_repo(TINY_MLX)
    assert (
        result.path.parent.parent
        == hf_cache.hf_cache_root() / "models--mlx-community--Tiny-Llama-128"
    )
    assert (hf_cache.repo_folder(TINY_MLX) / "refs" / "main").read_text() == repo.commit
    fetched = {p for (r, p), n in loopback_hub.bytes_served.items() if r == TINY_MLX and n}
    assert fetched == {
        "config.json",
        "generation_config.json",
        WEIGHTS,
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }  # no README, .bin, onnx/
    assert result.fetched_bytes == result.total_bytes == loopback_hub.served(TINY_MLX)
    for name in fetched:  # the bytes the hub has, linked the way huggingface_hub links them
        assert (result.path / name).read_bytes() == repo.files[name].read(0, repo.files[name].size)
        assert os.readlink(result.path / name) == f"../../blobs/{repo.files[name].etag}"
    # no HEAD per file
    assert [method for method, _ in loopback_hub.requests if method != "GET"] == []
    assert _blobs(TINY_MLX) == sorted(repo.files[n].etag for n in fetched)
    last = seen[-1]
    assert last.done_bytes == last.total_bytes == result.total_bytes and last.fraction == 1.0
    assert last.eta_seconds == 0.0 and max(p.rate for p in seen) > 0
    assert [p.done_bytes for p in seen] == sorted(p.done_bytes for p in seen)


def test_what_is_there_is_never_fetched_twice(loopback_hub, tmp_path):
    download.pull(TINY_MLX, data_root=tmp_path)
    served = loopback_hub.served(TINY_MLX)
    again = download.pull(TINY_MLX, data_root=tmp_path)
    assert again.fetched_bytes == 0 and loopback_hub.served(TINY_MLX) == served


def test_huggingface_hub_sees_the_same_files(loopback_hub, tmp_path):
    """mlx-lm and other tools find the model in the cache without a download."""
    from huggingface_hub import snapshot_download, try_to_load_from_cache

    result = download.pull(TINY_MLX, data_root=tmp_path)
    served = loopback_hub.served(TINY_MLX)
    assert try_to_load_from_cache(
        TINY_MLX, "config.json", cache_dir=hf_cache.hf_cache_root()
    ) == str(result.path / "config.json")
    folder = snapshot_download(
        TINY_MLX,
        allow_patterns=list(client.MLX_PATTERNS),
        cache_dir=hf_cache.hf_cache_root(),
        endpoint=loopback_hub.url,
    )
    assert folder == str(result.path) and loopback_hub.served(TINY_MLX) == served


def test_a_pulled_model_loads_and_remembers_its_hashes(loopback_hub, tmp_path):
    from core.models.load.loader import load_model

    result = download.pull(TINY_MLX, data_root=tmp_path)
    hashes = json.loads((tmp_path / "file_hashes.json").read_text())
    blob = (result.path / WEIGHTS).resolve()
    assert hashes[str(blob)]["sha256"] == loopback_hub.repos[TINY_MLX].files[WEIGHTS].sha256
    loaded = load_model(TINY_MLX, tmp_path)
    assert loaded.info.model_type == "llama" and loaded.info.path == str(result.path)
    assert loaded.info.name == TINY_MLX  # org/name, not the snapshot's commit id
    assert load_model(str(result.path), tmp_path).info.name == TINY_MLX  # by its folder too
    assert TINY_MLX in [m.spec for m in list_local_models(tmp_path)]


def test_cancel_then_resume_fetches_only_the_rest(loopback_hub, tmp_path):
    file = loopback_hub.repos[BIG_MLX].files[WEIGHTS]
    cancel = threading.Event()
    # ~0.5 s for the weights: progress comes every 0.1 s, the cancel lands mid-file
    loopback_hub.rate = 50e6

    def cancel_after_first_chunk(p):
        if p.file == WEIGHTS and p.fetched_bytes > 1 << 20:
            cancel.set()

    with pytest.raises(DownloadCancelled, match="pull it again to resume") as raised:
        download.pull(BIG_MLX, data_root=tmp_path, progress=cancel_after_first_chunk, cancel=cancel)
    assert "\n" not in str(raised.value)
    partial = hf_cache.repo_folder(BIG_MLX) / "blobs" / (file.etag + ".incomplete")
    kept = partial.stat().st_size
    assert 0 < kept < file.size
    assert hf_cache.resolve_repo(BIG_MLX) is None  # nothing half-downloaded is offered
    assert BIG_MLX not in [m.spec for m in installed.installed_models(tmp_path)]
    assert [p.repo_id for p in installed.partial_downloads()] == [BIG_MLX]

    loopback_hub.wait_idle()
    loopback_hub.rate = None
    before = loopback_hub.served(BIG_MLX, WEIGHTS)
    seen = []
    result = download.pull(BIG_MLX, data_root=tmp_path, progress=seen.append)
    # only what was missing
    assert loopback_hub.served(BIG_MLX, WEIGHTS) - before == file.size - kept
    assert result.fetched_bytes == file.size - kept
    assert seen[0].done_bytes >= kept  # progress starts from what was there
    assert hashlib.sha256((result.path / WEIGHTS).read_bytes()).hexdigest() == file.sha256
    assert not partial.exists() and hf_cache.resolve_repo(BIG_MLX) == result.path


def test_a_dropped_connection_resumes_in_place(loopback_hub, tmp_path):
    file = loopback_hub.repos[BIG_MLX].files[WEIGHTS]
    loopback_hub.drop_after[(BIG_MLX, WEIGHTS)] = 15 << 20  # 15 MB, then the line drops
    result = download.pull(BIG_MLX, data_root=tmp_path)
    assert hashlib.sha256((result.path / WEIGHTS).read_bytes()).hexdigest() == file.sha256
    # the retry asked for the rest only: 15 MB, then the other 12 MB
    assert loopback_hub.served(BIG_MLX, WEIGHTS) == file.size
    gets = [
        path for method, path in loopback_hub.requests if method == "GET" and path.endswith(WEIGHTS)
    ]
    assert len(gets) == 2


def test_a_killed_download_resumes_from_its_partial_file(loopback_hub, tmp_path):
    """A killed app leaves blobs/<etag>.incomplete behind: the next pull continues it."""
    file = loopback_hub.repos[TINY_MLX].files[WEIGHTS]
    blobs = hf_cache.repo_folder(TINY_MLX) / "blobs"
    blobs.mkdir(parents=True)
    (blobs / (file.etag + ".incomplete")).write_bytes(file.read(0, 300_000))
    download.pull(TINY_MLX, data_root=tmp_path)
    assert loopback_hub.served(TINY_MLX, WEIGHTS) == file.size - 300_000


def test_a_wrong_hash_is_caught_and_the_file_dropped(loopback_hub, tmp_path):
    loopback_hub.corrupt.add((TINY_MLX, WEIGHTS))
    with pytest.raises(
        HubError, match="model.safetensors of .* failed its hash check .* deleted; pull again"
    ):
        download.pull(TINY_MLX, data_root=tmp_path)
    assert hf_cache.resolve_repo(TINY_MLX) is None
    etag = loopback_hub.repos[TINY_MLX].files[WEIGHTS].etag
    # dropped, not kept
    assert etag + ".incomplete" not in _blobs(TINY_MLX) and etag not in _blobs(TINY_MLX)
    loopback_hub.corrupt.clear()
    assert download.pull(TINY_MLX, data_root=tmp_path).path == hf_cache.resolve_repo(TINY_MLX)


def test_a_wrong_small_file_is_caught_by_its_git_blob_id(loopback_hub, tmp_path):
    loopback_hub.corrupt.add((TINY_MLX, "tokenizer.json"))
    with pytest.raises(HubError, match="tokenizer.json of .* failed its hash check \\(git blob id"):
        download.pull(TINY_MLX, data_root=tmp_path)


def test_an_architecture_mlx_lm_cannot_load_stops_before_the_weights(loopback_hub, tmp_path):
    with pytest.raises(HubError, match="bert model, which mlx-lm can't load"):
        download.pull(BERT_MLX, data_root=tmp_path)
    assert loopback_hub.served(BERT_MLX, WEIGHTS) == 0 and hf_cache.resolve_repo(BERT_MLX) is None


def test_a_gated_repo_says_what_to_do(loopback_hub, tmp_path, monkeypatch):
    with pytest.raises(
        HubError, match="is gated: it needs your Hugging Face token .* accept its terms"
    ):
        download.pull(GATED, data_root=tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_someone_else")
    with pytest.raises(
        HubError, match="is gated: your token's account has not accepted its licence"
    ):
        download.pull(GATED, data_root=tmp_path)
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert download.pull(GATED, data_root=tmp_path).spec == GATED


def test_not_enough_disk_space_is_said_before_downloading(loopback_hub, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 1000, 1000))
    with pytest.raises(HubError, match="not enough disk space for .*Tiny-Llama-128: it needs"):
        download.pull(TINY_MLX, data_root=tmp_path)
    assert loopback_hub.served(TINY_MLX) == 0


def test_a_full_disk_mid_download_keeps_the_part(loopback_hub, tmp_path, monkeypatch):
    import errno

    real_put = download._Sink._put
    disk_full = [True]

    def put(self, data):
        if disk_full[0] and self._raw.tell() > 5 << 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_put(self, data)

    monkeypatch.setattr(download._Sink, "_put", put)
    with pytest.raises(
        HubError, match="the disk is full: model.safetensors .* stopped at [0-9] MB \\(kept\\)"
    ):
        download.pull(BIG_MLX, data_root=tmp_path)
    assert hf_cache.resolve_repo(BIG_MLX) is None
    disk_full[0] = False
    loopback_hub.wait_idle()
    before = loopback_hub.served(BIG_MLX, WEIGHTS)
    download.pull(BIG_MLX, data_root=tmp_path)  # space again: the rest comes
    assert (
        loopback_hub.served(BIG_MLX, WEIGHTS) - before
        < loopback_hub.repos[BIG_MLX].files[WEIGHTS].size
    )


def test_a_gguf_file_pulls_alone(loopback_hub, tmp_path):
    result = download.pull(f"{TWO_GGUF}:tiny-Q8_0.gguf", data_root=tmp_path)
    assert result.kind == "gguf" and result.path.name == "tiny-Q8_0.gguf"
    assert (
        loopback_hub.served(TWO_GGUF) == loopback_hub.repos[TWO_GGUF].files["tiny-Q8_0.gguf"].size
    )
    assert hf_cache.resolve_gguf(result.spec) == result.path
    entry = next(m for m in list_local_models(tmp_path) if m.spec == result.spec)
    assert entry.kind == "hf-gguf"


def test_parse_target():
    assert download.parse_target("org/name") == ("org/name", None)
    assert download.parse_target(" org/name:q.gguf ") == ("org/name", "q.gguf")


# ------------------------------------------------------------------ issue 42.5
def _part(repo_id: str, name: str = WEIGHTS):
    """The repo's file ``name`` on the loopback hub, and where its part file goes."""
    file = next(f for f in client.plan(repo_id, None).files if f.path == name)
    blobs = hf_cache.repo_folder(repo_id) / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    return file, blobs / (file.etag + download.PARTIAL_SUFFIX)


def test_a_part_file_that_is_a_symlink_is_replaced_never_written_through(loopback_hub, tmp_path):
    """On main the resumed pull appended the whole file to what the link pointed at."""
    file, partial = _part(TINY_MLX)
    outside = tmp_path / "precious.bin"
    kept = loopback_hub.repos[TINY_MLX].files[WEIGHTS].read(0, 1000)  # a prefix: resumable
    outside.write_bytes(kept)
    partial.symlink_to(outside)
    assert [p.repo_id for p in installed.partial_downloads()] == []  # a link is no part
    result = download.pull(TINY_MLX, data_root=tmp_path)
    assert outside.read_bytes() == kept  # untouched
    blob = hf_cache.repo_folder(TINY_MLX) / "blobs" / file.etag
    assert not blob.is_symlink() and not partial.exists() and not partial.is_symlink()
    assert hashlib.sha256((result.path / WEIGHTS).read_bytes()).hexdigest() == file.sha256
    assert loopback_hub.served(TINY_MLX, WEIGHTS) == file.size  # from the start


def test_a_part_file_that_is_a_folder_is_replaced(loopback_hub, tmp_path):
    """On main every later pull failed until the folder was removed by hand."""
    file, partial = _part(TINY_MLX)
    partial.mkdir()
    (partial / "inside").write_text("x")
    result = download.pull(TINY_MLX, data_root=tmp_path)
    assert hashlib.sha256((result.path / WEIGHTS).read_bytes()).hexdigest() == file.sha256
    assert not partial.exists()


def test_a_blob_that_is_a_link_or_a_folder_is_fetched_again(loopback_hub, tmp_path):
    """``blobs/<etag>`` is the download's own file: a link there is not taken for it."""
    file, _ = _part(TINY_MLX)
    outside = tmp_path / "other.bin"
    outside.write_bytes(b"not the weights")
    blob = hf_cache.repo_folder(TINY_MLX) / "blobs" / file.etag
    blob.symlink_to(outside)
    config, _ = _part(TINY_MLX, "config.json")
    (blob.with_name(config.etag)).mkdir()
    result = download.pull(TINY_MLX, data_root=tmp_path)
    assert outside.read_bytes() == b"not the weights"
    assert not blob.is_symlink()
    assert hashlib.sha256((result.path / WEIGHTS).read_bytes()).hexdigest() == file.sha256
    assert json.loads((result.path / "config.json").read_text())["model_type"]


def test_the_revision_ref_is_never_written_through_a_link(loopback_hub, tmp_path):
    refs = hf_cache.repo_folder(TINY_MLX) / "refs"
    refs.mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("mine")
    (refs / f".main.{os.getpid()}.tmp").symlink_to(outside)
    download.pull(TINY_MLX, data_root=tmp_path)
    assert outside.read_text() == "mine"
    assert (refs / "main").read_text() == loopback_hub.repos[TINY_MLX].commit
    assert not (refs / "main").is_symlink()
