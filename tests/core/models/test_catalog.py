"""The picker's catalog: known and local models, parameter counts from headers, memory estimates."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest

from core.errors import UserError
from core.models import catalog as catalog_module
from core.models.catalog import (
    CatalogEntry,
    entry_for_path,
    estimate_memory_bytes,
    gguf_parameter_count,
    safetensors_parameter_count,
)
from core.models.catalog import (
    model_catalog as catalog,
)
from core.models.pypi import provision
from core.models.tiny_model import TinyModelSpec, write_tiny_model

GGUF_PARAMETERS = 16 * 8 + 8 * 8 + 4 * 64


def write_gguf(path, chat_template: str | None = None, name: str | None = None):
    """A small GGUF file: a vocabulary, nested metadata, float and Q8_0 tensors; with no
    chat template (a base model) unless one is given."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_token_list(["a", "bb", "<s>"] * 1000)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    if name is not None:
        writer.add_name(name)
    writer.add_array("test.nested", [[1, 2], [3, 4, 5]])
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((8, 8), dtype=np.float16))
    quantized = gguf.quants.quantize(
        np.ones((4, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0
    )
    writer.add_tensor("output.weight", quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(autouse=True)
def no_hf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def test_memory_estimates():
    mb = 2**20
    assert (
        estimate_memory_bytes("gguf", 100 * mb, on_cpu=True, parameters=135_000_000) == 540_000_000
    )
    assert estimate_memory_bytes("gguf", 90 * mb, on_cpu=True) == 640 * mb  # 4.5 bits -> 32 bits
    assert (
        estimate_memory_bytes("known-gguf", 90 * mb, on_cpu=False, parameters=135_000_000)
        == 90 * mb
    )
    assert estimate_memory_bytes("mlx-dir", 300 * mb, on_cpu=True) == 300 * mb
    assert estimate_memory_bytes("hf-cache", 300 * mb, on_cpu=False) == 300 * mb


def test_gguf_parameter_count_reads_the_header(tmp_path):
    path = write_gguf(tmp_path / "small.gguf")
    assert gguf_parameter_count(path) == GGUF_PARAMETERS
    reader = gguf.GGUFReader(str(path))
    assert sum(int(t.n_elements) for t in reader.tensors) == GGUF_PARAMETERS


def test_gguf_parameter_count_of_broken_files(tmp_path):
    path = write_gguf(tmp_path / "small.gguf")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:200])  # inside the vocabulary
    assert gguf_parameter_count(cut) is None
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model" * 10)
    assert gguf_parameter_count(junk) is None
    assert gguf_parameter_count(tmp_path / "missing.gguf") is None
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert gguf_parameter_count(empty) is None


def test_gguf_parameter_count_follows_a_changed_file(tmp_path):
    path = write_gguf(tmp_path / "small.gguf")
    assert gguf_parameter_count(path) == GGUF_PARAMETERS
    path.write_bytes(b"GGUF" + b"\0" * 30)  # another size: read again, not from the memo
    assert gguf_parameter_count(path) is None


def test_safetensors_parameter_count_float_and_quantized(tmp_path):
    folder = write_tiny_model(tmp_path / "tiny", TinyModelSpec(num_layers=2))
    weights = mx.load(str(folder / "model.safetensors"))
    parameters = sum(math.prod(v.shape) for v in weights.values())
    assert safetensors_parameter_count(folder) == parameters

    from mlx_lm import convert

    quantized = tmp_path / "tiny-4bit"
    convert(str(folder), mlx_path=str(quantized), quantize=True, q_bits=4, q_group_size=32)
    assert any(name.endswith(".scales") for name in mx.load(str(quantized / "model.safetensors")))
    assert safetensors_parameter_count(quantized) == parameters  # dequantized on the CPU
    assert safetensors_parameter_count(tmp_path) is None  # no config.json


def test_catalog_of_an_empty_data_folder_offers_the_known_models(tmp_path):
    entries = catalog(tmp_path, on_cpu=True)
    assert [e.spec for e in entries] == list(provision.KNOWN_MODELS)
    default = entries[0]
    assert default.spec == "default" and not default.downloaded and default.kind == "known-gguf"
    assert default.size_bytes == provision.KNOWN_MODELS["default"].size
    assert (
        default.memory_bytes
        == 4 * catalog_module.KNOWN_PARAMETERS[provision.KNOWN_MODELS["default"].sha256]
    )
    assert catalog(tmp_path, on_cpu=False)[0].memory_bytes == default.size_bytes


def test_catalog_lists_local_models_with_their_memory(tmp_path, monkeypatch):
    models = tmp_path / "models"
    models.mkdir()
    write_gguf(models / "small.gguf")
    folder = write_tiny_model(models / "tiny-llama", TinyModelSpec(num_layers=2))
    snapshot = write_tiny_model(
        tmp_path / "hf-cache" / "models--org--tiny" / "snapshots" / "abc", TinyModelSpec()
    )
    entries = {e.spec: e for e in catalog(tmp_path, on_cpu=True)}

    small = entries[str(models / "small.gguf")]
    assert small == CatalogEntry(
        str(models / "small.gguf"),
        "small",
        "gguf",
        (models / "small.gguf").stat().st_size,
        4 * GGUF_PARAMETERS,
        base=True,  # no chat template in its file
    )
    tiny = entries[str(folder)]
    assert not tiny.base and not entries["org/tiny"].base  # their tokenizer_config has one
    weights = (folder / "model.safetensors").stat().st_size
    # float32 stays float32
    assert tiny.kind == "mlx-dir" and 0.98 * weights <= tiny.memory_bytes <= weights
    assert entries["org/tiny"].kind == "hf-cache"
    assert entries["org/tiny"].memory_bytes == 4 * safetensors_parameter_count(snapshot)


def test_entry_for_a_picked_path(tmp_path):
    gguf_file = write_gguf(tmp_path / "picked.gguf")
    assert entry_for_path(gguf_file, on_cpu=True).memory_bytes == 4 * GGUF_PARAMETERS
    folder = write_tiny_model(tmp_path / "tiny", TinyModelSpec(num_layers=2))
    assert entry_for_path(folder, on_cpu=False).kind == "mlx-dir"
    with pytest.raises(UserError, match="not an MLX model folder"):
        entry_for_path(tmp_path)
    with pytest.raises(UserError, match="not a .gguf file"):
        entry_for_path(folder / "config.json")


def test_base_models_are_marked_from_their_files(tmp_path):
    """A GGUF file without a chat template, or named base, and an MLX folder whose template
    went, are base models; the known models say so before they are downloaded."""
    models = tmp_path / "models"
    models.mkdir()
    write_gguf(models / "plain.gguf")
    write_gguf(models / "chat.gguf", chat_template="{{ messages }}")
    write_gguf(models / "named.gguf", chat_template="{{ messages }}", name="Llama 3.2 1B Base")
    write_gguf(models / "Qwen3-0.6B-Base-Q8_0.gguf", chat_template="{{ messages }}")
    folder = write_tiny_model(models / "tiny-llama", TinyModelSpec(num_layers=2))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    entries = {Path(e.spec).name: e for e in catalog(tmp_path, on_cpu=True)}
    assert entries["plain.gguf"].base and not entries["chat.gguf"].base
    assert entries["named.gguf"].base and entries["Qwen3-0.6B-Base-Q8_0.gguf"].base
    assert entries["tiny-llama"].base
    assert entries["gemma3-270m"].base and not entries["default"].base
    assert not entries["qwen2.5-coder-0.5b"].base
    (folder / "chat_template.jinja").write_text("{{ messages }}")  # a template file of its own
    assert not entry_for_path(folder).base
