"""The hand-written walk of the Hugging Face hub cache (no network, no huggingface_hub)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from core.models.hub import hf_cache


def make_repo(
    root: Path, repo_id: str, revs: dict[str, dict[str, bytes]], main: str | None = None
) -> Path:
    """A cache entry like huggingface_hub writes: files in blobs/, links from snapshots/<rev>/."""
    folder = root / ("models--" + repo_id.replace("/", "--"))
    for rev, files in revs.items():
        snap = folder / "snapshots" / rev
        snap.mkdir(parents=True)
        for name, data in files.items():
            blob = folder / "blobs" / f"{rev}-{name}"
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            try:
                (snap / name).symlink_to(os.path.relpath(blob, snap))
            except OSError:  # no symlinks (Windows without developer mode): copies, as hf does
                (snap / name).write_bytes(data)
    if main:
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text(main + "\n")
    return folder


MODEL = {"config.json": b"{}", "model.safetensors": b"x"}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    return root


def test_root_follows_environment(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    assert hf_cache.hf_cache_root() == Path.home() / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_cache.hf_cache_root() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert hf_cache.hf_cache_root() == tmp_path / "hfhome" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "direct"))
    assert hf_cache.hf_cache_root() == tmp_path / "direct"


def test_resolve_follows_refs_main(cache):
    make_repo(cache, "org/model", {"aaa": MODEL, "bbb": MODEL}, main="aaa")
    assert hf_cache.resolve_repo("org/model") == cache / "models--org--model" / "snapshots" / "aaa"


def test_resolve_without_refs_takes_newest_snapshot(cache):
    folder = make_repo(cache, "org/model", {"old": MODEL, "new": MODEL})
    os.utime(folder / "snapshots" / "old", (1_000_000, 1_000_000))
    assert hf_cache.resolve_repo("org/model") == folder / "snapshots" / "new"


def test_resolve_needs_config_json(cache):
    make_repo(cache, "org/tok", {"aaa": {"tokenizer.json": b"{}"}}, main="aaa")
    assert hf_cache.resolve_repo("org/tok") is None
    assert hf_cache.resolve_repo("org/absent") is None


@pytest.mark.parametrize("bad", ["", "a/b/c", "../x", "org/..", "/abs"])
def test_resolve_rejects_odd_repo_ids(cache, bad):
    assert hf_cache.resolve_repo(bad) is None


def test_list_cached_repos(cache):
    make_repo(
        cache, "org/model", {"aaa": {"config.json": b"{}", "model.safetensors": b"x"}}, main="aaa"
    )
    make_repo(cache, "solo", {"r1": MODEL}, main="r1")
    make_repo(cache, "org/config-only", {"r": {"config.json": b"{}"}}, main="r")
    make_repo(cache, "org/tokenizer-only", {"r": {"tokenizer.json": b"{}"}}, main="r")
    (cache / "datasets--org--data" / "snapshots" / "r").mkdir(parents=True)
    (cache / "datasets--org--data" / "snapshots" / "r" / "config.json").write_text("{}")
    assert hf_cache.list_cached_repos() == [
        ("org/model", cache / "models--org--model" / "snapshots" / "aaa"),
        ("solo", cache / "models--solo" / "snapshots" / "r1"),
    ]


def test_list_cached_repos_without_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "missing"))
    assert hf_cache.list_cached_repos() == []


def test_import_is_light():
    """hf_cache must not pull in huggingface_hub, mlx or Qt."""
    import subprocess

    code = (
        "import sys, core.models.hub.hf_cache, core.models.pypi.provision; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'huggingface_hub', "
        "'PySide6', 'mlx_lm', 'transformers')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[4],
    )
    assert out.stdout.strip() == "[]"


def test_a_model_without_all_its_weights_is_not_offered(cache):
    """A download in progress (or cut short) links config.json before or without the
    weights: such a snapshot is not a model yet."""
    index = (
        b'{"weight_map": {"a": "model-00001-of-00002.safetensors", '
        b'"b": "model-00002-of-00002.safetensors"}}'
    )
    make_repo(
        cache,
        "org/sharded",
        {
            "r": {
                "config.json": b"{}",
                "model.safetensors.index.json": index,
                "model-00001-of-00002.safetensors": b"x",
            }
        },
        main="r",
    )
    make_repo(
        cache, "org/no-weights", {"r": {"config.json": b"{}", "tokenizer.json": b"{}"}}, main="r"
    )
    make_repo(
        cache,
        "org/bad-index",
        {
            "r": {
                "config.json": b"{}",
                "model.safetensors.index.json": b"[",
                "model.safetensors": b"x",
            }
        },
        main="r",
    )
    assert hf_cache.resolve_repo("org/sharded") is None
    assert hf_cache.resolve_repo("org/no-weights") is None
    assert hf_cache.resolve_repo("org/bad-index") is None
    (
        cache / "models--org--sharded" / "snapshots" / "r" / "model-00002-of-00002.safetensors"
    ).write_bytes(b"y")
    assert (
        hf_cache.resolve_repo("org/sharded") == cache / "models--org--sharded" / "snapshots" / "r"
    )
    assert [r for r, _ in hf_cache.list_cached_repos()] == ["org/sharded"]


def test_gguf_files_in_the_cache(cache):
    make_repo(cache, "org/quants", {"r": {"m-Q4_K_M.gguf": b"GGUF", "README.md": b"#"}}, main="r")
    snapshot = cache / "models--org--quants" / "snapshots" / "r"
    assert hf_cache.list_cached_ggufs() == [
        ("org/quants:m-Q4_K_M.gguf", snapshot / "m-Q4_K_M.gguf")
    ]
    assert hf_cache.resolve_gguf("org/quants:m-Q4_K_M.gguf") == snapshot / "m-Q4_K_M.gguf"
    assert hf_cache.resolve_gguf("org/quants:m-Q8_0.gguf") is None
    assert hf_cache.resolve_gguf("org/absent:m.gguf") is None
    for odd in (
        "org/quants",
        "org/quants:README.md",
        "org/quants:../x.gguf",
        "a/b/c:m.gguf",
        "org/quants:/m.gguf",
    ):
        assert hf_cache.split_gguf_spec(odd) is None, odd
    assert hf_cache.split_gguf_spec("org/quants:sub/m.gguf") == ("org/quants", "sub/m.gguf")
