"""Local models under Ollama's names (core/api/ollama_models.py): names from files, folders
and hub repos, a client's name matched, digests, and ``/api/show`` of a model that is not
loaded (from its files)."""

from __future__ import annotations

import hashlib
import re

import pytest

from core.api.ollama_models import find, local_models, parameter_size, show_body
from core.models.pypi.known import KNOWN_MODELS
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.models.test_catalog import write_gguf

CONTINUE_PARAMETER = r'^(\S+)\s+((?:".*")|\S+)$'


@pytest.fixture
def machine(tmp_path, monkeypatch, default_model_file):
    """A data folder with the default model, a GGUF file and an MLX folder of the user's,
    and a hub cache with an MLX repo and a GGUF file."""
    data = tmp_path / "data"
    models = data / "models"
    models.mkdir(parents=True)
    (models / default_model_file.name).symlink_to(default_model_file)
    write_gguf(models / "My-Coder-7B.Q5_K_M.gguf")
    write_tiny_model(models / "My_MLX Model", TinyModelSpec())
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    repo = hub / "models--org--Tiny-MLX"
    snapshot = repo / "snapshots" / "abc"
    write_tiny_model(tmp_path / "source", TinyModelSpec())
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in (tmp_path / "source").iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    gguf_repo = hub / "models--org--Solo-GGUF"
    (gguf_repo / "snapshots" / "def").mkdir(parents=True)
    (gguf_repo / "blobs").mkdir()
    gguf = write_gguf(tmp_path / "solo.gguf").read_bytes()
    digest = hashlib.sha256(gguf).hexdigest()
    (gguf_repo / "blobs" / digest).write_bytes(gguf)
    (gguf_repo / "snapshots" / "def" / "solo-Q4_K_M.gguf").symlink_to(gguf_repo / "blobs" / digest)
    (gguf_repo / "refs").mkdir()
    (gguf_repo / "refs" / "main").write_text("def")
    return data, digest


def test_every_local_model_gets_an_ollama_name(machine):
    data, gguf_digest = machine
    named = {m.name: m for m in local_models(data)}
    assert set(named) == {
        "smollm2-135m-instruct:q4_1",  # the known model: its file's name, the quant as tag
        "my-coder-7b:q5_k_m",
        "my_mlx-model:latest",
        "hf.co/org/Tiny-MLX:latest",
        "hf.co/org/Solo-GGUF:Q4_K_M",
    }
    assert named["smollm2-135m-instruct:q4_1"].digest == KNOWN_MODELS["default"].sha256
    assert named["hf.co/org/Solo-GGUF:Q4_K_M"].digest == gguf_digest  # the blob's hash
    assert all(re.fullmatch(r"[0-9a-f]{64}", m.digest) for m in named.values())
    details = named["smollm2-135m-instruct:q4_1"].details()
    assert details == {
        "parent_model": "",
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": "134.5M",
        "quantization_level": "Q4_1",
    }
    assert named["my_mlx-model:latest"].listed()["modified_at"].endswith("Z")


@pytest.mark.parametrize(
    ("asked", "name"),
    [
        ("default", "smollm2-135m-instruct:q4_1"),  # RadixChat's own name
        ("default:latest", "smollm2-135m-instruct:q4_1"),
        ("SmolLM2-135M-Instruct:Q4_1", "smollm2-135m-instruct:q4_1"),  # any case
        ("my_mlx-model", "my_mlx-model:latest"),  # without :latest
        ("org/Tiny-MLX", "hf.co/org/Tiny-MLX:latest"),  # without hf.co/
        ("huggingface.co/org/tiny-mlx:latest", "hf.co/org/Tiny-MLX:latest"),
        ("org/Solo-GGUF:solo-Q4_K_M.gguf", "hf.co/org/Solo-GGUF:Q4_K_M"),  # the spec
        ("llama3.2", None),
    ],
)
def test_a_clients_name_finds_its_model(machine, asked, name):
    found = find(local_models(machine[0]), asked)
    assert (found.name if found else None) == name


def test_show_of_a_model_that_is_not_loaded_comes_from_its_files(machine):
    model = find(local_models(machine[0]), "default")
    shown = show_body(model)
    assert shown["template"].startswith("{% for message in messages %}")  # the file's own
    assert shown["capabilities"] == ["completion"]  # SmolLM2's own template takes no tools
    assert shown["model_info"]["llama.context_length"] == 8192
    lines = [re.match(CONTINUE_PARAMETER, line) for line in shown["parameters"].split("\n")]
    assert all(lines) and [m.groups() for m in lines] == [("num_ctx", "8192")]
    assert shown["radixchat"] == {"spec": "default", "loaded": False}


def test_two_files_that_would_share_a_name_do_not(machine):
    data, _ = machine
    write_gguf(data / "models" / "my-coder-7b-Q5_K_M.gguf")
    names = [m.name for m in local_models(data) if m.name.startswith("my-coder")]
    assert sorted(names) == ["my-coder-7b:q5_k_m", "my-coder-7b:q5_k_m-2"]


@pytest.mark.parametrize(
    ("count", "said"), [(None, ""), (107_200, "107.2K"), (134_515_008, "134.5M"), (8.03e9, "8.0B")]
)
def test_parameter_sizes_as_ollama_writes_them(count, said):
    assert parameter_size(count) == said
