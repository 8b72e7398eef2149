"""Loading model specs: MLX folders, HF cache repos, bad input, fingerprints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.errors import ModelLoadError
from core.models.load.loader import load_model, resolve_weights_format


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_mlx_folder_loads_with_info(tiny_model, tmp_path):
    loaded = load_model(str(tiny_model), tmp_path)
    info = loaded.info
    assert info.model_type == "llama" and info.num_layers == 2
    assert info.weights_format == "float32"  # CPU backend: auto -> float32
    assert info.context_length == 512 and info.weight_bytes > 0
    assert loaded.tokenizer.encode("hi") == [104, 105]


def test_fingerprint_is_stable_and_tracks_what_changes_numbers(tiny_model, tmp_path):
    a = load_model(str(tiny_model), tmp_path).info.fingerprint
    assert load_model(str(tiny_model), tmp_path).info.fingerprint == a
    assert load_model(str(tiny_model), tmp_path, "bfloat16").info.fingerprint != a

    from core.models.tiny_model import TinyModelSpec, write_tiny_model

    other = write_tiny_model(tmp_path / "other-seed", TinyModelSpec(num_layers=2, seed=1))
    assert load_model(str(other), tmp_path).info.fingerprint != a


def test_fingerprint_changes_with_the_code_that_computes(tiny_model, tmp_path, monkeypatch):
    import core.models.load.fingerprint as fp

    a = load_model(str(tiny_model), tmp_path).info.fingerprint
    assert set(fp.runtime_versions()) == {"mlx", "mlx_lm", "radixchat_numerics", "gguf_conversion"}
    monkeypatch.setattr(fp, "NUMERICS_VERSION", fp.NUMERICS_VERSION + 1)
    assert load_model(str(tiny_model), tmp_path).info.fingerprint != a  # saved K/V is not reused
    monkeypatch.undo()
    versions = fp.runtime_versions()
    monkeypatch.setattr(fp, "runtime_versions", lambda: {**versions, "mlx": "0.0.1"})
    assert load_model(str(tiny_model), tmp_path).info.fingerprint != a


def test_repo_id_from_local_hf_cache(tiny_model, tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--someorg--tiny" / "snapshots" / "abc123"
    copy_model(tiny_model, snapshot)
    (tmp_path / "hub" / "models--someorg--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--someorg--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert load_model("someorg/tiny", tmp_path).info.name == "someorg/tiny"  # not its commit
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        load_model("someorg/absent", tmp_path)


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="no model at"):
        load_model(str(tmp_path / "nope.gguf"), tmp_path)


def test_folder_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(tmp_path / "empty"), tmp_path)


def test_truncated_safetensors(tiny_model, tmp_path):
    bad = copy_model(tiny_model, tmp_path / "truncated")
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(str(bad), tmp_path)


def test_unsupported_architecture(tiny_model, tmp_path):
    bad = copy_model(tiny_model, tmp_path / "alien")
    config = json.loads((bad / "config.json").read_text())
    config["model_type"] = "alien_transformer"
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="alien_transformer.*not supported"):
        load_model(str(bad), tmp_path)


@pytest.mark.parametrize(
    "content, message",
    [(b"not a gguf at all", "not a readable GGUF"), (b"GGUF" + b"\0" * 64, "holds no model")],
)
def test_garbage_gguf(tmp_path, content, message):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    with pytest.raises(ModelLoadError, match=message):
        load_model(str(bad), tmp_path)


def test_unknown_weight_format(tiny_model, tmp_path):
    with pytest.raises(ModelLoadError, match="unknown weight format"):
        resolve_weights_format("int3")
