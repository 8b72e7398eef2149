"""Model fingerprints: one digest for everything that changes the numbers, and nothing else."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest

from core.models import hashing
from core.models.hashing import FileHashCache
from core.models.load import fingerprint as fp
from core.models.load.fingerprint import NUMERICS_VERSION, model_fingerprint, runtime_versions
from core.models.load.gguf_convert import CACHE_FORMAT

RUNTIME = {"mlx": "1", "mlx_lm": "2", "radixchat_numerics": "1", "gguf_conversion": "1"}
CONFIG = {"model_type": "llama", "hidden_size": 64}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "model").mkdir()
    paths = [
        tmp_path / "model" / name
        for name in ("config.json", "weights.safetensors", "tokenizer.json")
    ]
    for i, path in enumerate(paths):
        path.write_bytes(bytes([i]) * 100)
    return paths


def digest(files, config=CONFIG, weights_format="float32", runtime=RUNTIME, hashes=None):
    return model_fingerprint(config, files, weights_format, hashes or FileHashCache(None), runtime)


def test_the_same_model_has_the_same_fingerprint(files):
    first = digest(files)
    assert len(first) == 64 and int(first, 16) >= 0
    assert digest(files) == first
    assert digest(list(reversed(files))) == first  # the order files are listed in does not count
    # nor the order of keys
    assert digest(files, config=dict(reversed(list(CONFIG.items())))) == first


def test_everything_that_changes_the_numbers_changes_it(files, tmp_path):
    base = digest(files)
    variants = {
        "config": digest(files, config={**CONFIG, "hidden_size": 65}),
        "format": digest(files, weights_format="stored"),
        "runtime": digest(files, runtime={**RUNTIME, "mlx": "9"}),
        "file set": digest(files[:2]),
    }
    files[1].write_bytes(b"\x01" * 99 + b"\x02")  # one byte of the weights
    variants["bytes"] = digest(files)
    files[1].write_bytes(b"\x01" * 100)
    renamed = files[2].with_name("tokenizer.model")
    files[2].rename(renamed)
    variants["file name"] = digest([*files[:2], renamed])
    assert base not in variants.values()
    assert len(set(variants.values())) == len(variants), variants


def test_the_folder_a_model_sits_in_does_not_count(files, tmp_path):
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    copies = []
    for path in files:
        copies.append(moved / path.name)
        copies[-1].write_bytes(path.read_bytes())
    assert digest(copies) == digest(files)


def test_files_are_hashed_through_the_cache(files, tmp_path, monkeypatch):
    reads = []
    real = hashing.sha256_file
    monkeypatch.setattr(
        hashing, "sha256_file", lambda p, on_fraction=None: reads.append(p) or real(p, on_fraction)
    )
    hashes = FileHashCache(tmp_path / "hashes.json")
    first = digest(files, hashes=hashes)
    assert len(reads) == 3
    assert (
        digest(files, hashes=FileHashCache(tmp_path / "hashes.json")) == first and len(reads) == 3
    )


def test_runtime_versions_name_the_code_that_computes():
    versions = runtime_versions()
    assert versions == {
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "radixchat_numerics": str(NUMERICS_VERSION),
        "gguf_conversion": str(CACHE_FORMAT),
    }


def test_the_default_runtime_is_the_installed_one(files, monkeypatch):
    assert model_fingerprint(CONFIG, files, "float32", FileHashCache(None)) == digest(
        files, runtime=runtime_versions()
    )
    monkeypatch.setattr(
        fp, "runtime_versions", lambda: {**runtime_versions(), "gguf_conversion": "999"}
    )
    assert model_fingerprint(CONFIG, files, "float32", FileHashCache(None)) != digest(
        files, runtime=runtime_versions()
    )
