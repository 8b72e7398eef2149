"""A model described from its files without loading it (core/models/describe.py): a GGUF
header's facts, an MLX folder's config under GGUF's names, the chat template either keeps."""

from __future__ import annotations

import json

import pytest

from core.errors import UserError
from core.models.describe import describe_model
from core.models.tiny_model import CHAT_TEMPLATE, TinyModelSpec, write_tiny_model
from tests.core.models.test_catalog import write_gguf


def test_a_gguf_file_from_its_header(tmp_path):
    path = write_gguf(tmp_path / "tiny-Q8_0.gguf")
    described = describe_model(path)
    assert described.format == "gguf" and described.architecture == "llama"
    assert described.parameter_count == 16 * 8 + 8 * 8 + 4 * 64
    assert described.info["general.parameter_count"] == described.parameter_count
    assert described.info["llama.block_count"] == 1
    assert "tokenizer.ggml.tokens" not in described.info  # arrays are left out
    assert described.quantization == "Q8_0"  # no file type in the header: the file's name


def test_the_default_models_header(default_model_file):
    described = describe_model(default_model_file)
    assert (described.architecture, described.quantization) == ("llama", "Q4_1")
    assert described.context_length == described.info["llama.context_length"] == 8192
    assert "<|im_start|>" in described.chat_template
    assert 130e6 < described.parameter_count < 140e6


def test_an_mlx_folder_from_its_config(tmp_path):
    folder = write_tiny_model(tmp_path / "tiny", TinyModelSpec(max_position_embeddings=1024))
    described = describe_model(folder)
    config = json.loads((folder / "config.json").read_text())
    assert described.format == "safetensors" and described.architecture == "llama"
    assert described.context_length == 1024 == described.info["llama.context_length"]
    assert described.info["llama.block_count"] == config["num_hidden_layers"]
    assert described.quantization == "F32" and described.chat_template == CHAT_TEMPLATE
    (folder / "chat_template.jinja").write_text("{{ messages }} own")
    config["model_type"] = "qwen2"  # a changed config is read again
    (folder / "config.json").write_text(json.dumps(config))
    again = describe_model(folder)
    assert again.chat_template == "{{ messages }} own" and again.architecture == "qwen2"


def test_what_cannot_be_read_is_a_user_error(tmp_path):
    with pytest.raises(UserError):
        describe_model(tmp_path / "absent.gguf")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf")
    with pytest.raises(UserError):
        describe_model(broken)


def test_a_model_card_added_later_is_read(tmp_path):
    # the description is cached by its files' times: a README.md written after the first
    # look (as a download ends) must not leave "no license" cached
    folder = write_tiny_model(tmp_path / "tiny", TinyModelSpec(num_layers=1))
    assert describe_model(folder).license == ""
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# tiny\n")
    assert describe_model(folder).license == "mit"
