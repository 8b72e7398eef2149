"""Base models told from their files, without loading weights: GGUF headers, MLX folders."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from core import paths
from core.models import base_models
from core.models.base_models import gguf_metadata_is_base, is_base_model, named_base
from core.models.pypi import provision
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.models.test_catalog import write_gguf

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"
QWEN_FILE = Path("/tmp/qwen/qwen2.5-coder-0.5b-instruct.gguf")


def test_names_that_say_base():
    for name in ("Qwen3-0.6B-Base", "granite-3.0-2b-base", "Llama 3.2 1B Base", "base"):
        assert named_base(name), name
    for name in ("codebase-llama", "Qwen2.5 Coder 0.5B Instruct AWQ", "basement", None, 3):
        assert not named_base(name), name


def test_gguf_metadata():
    assert gguf_metadata_is_base({})
    assert gguf_metadata_is_base({"tokenizer.chat_template": ""})
    assert not gguf_metadata_is_base({"tokenizer.chat_template": TEMPLATE})
    assert gguf_metadata_is_base({"tokenizer.chat_template": TEMPLATE, "general.finetune": "Base"})


def test_a_gguf_file(tmp_path):
    assert is_base_model(write_gguf(tmp_path / "plain.gguf"))
    assert not is_base_model(write_gguf(tmp_path / "chat.gguf", chat_template=TEMPLATE))
    assert is_base_model(write_gguf(tmp_path / "x.gguf", chat_template=TEMPLATE, name="X Base"))
    named = write_gguf(tmp_path / "Qwen3-0.6B-Base-Q8_0.gguf", chat_template=TEMPLATE)
    assert is_base_model(named)  # its file name
    assert not is_base_model(named, name="my-model")  # the name it is known by instead
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")
    assert not is_base_model(junk) and not is_base_model(tmp_path / "missing.gguf")


def test_a_changed_file_is_read_again_and_an_unchanged_one_is_not(tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    cache = base_models._gguf_is_base
    cache.cache_clear()
    assert is_base_model(path) and is_base_model(path)
    assert (cache.cache_info().misses, cache.cache_info().hits) == (1, 1)  # read once
    write_gguf(path, chat_template=TEMPLATE)
    os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns + 10**9))
    assert not is_base_model(path) and cache.cache_info().misses == 2


def test_an_mlx_folder(tmp_path):
    folder = write_tiny_model(tmp_path / "tiny", TinyModelSpec(num_layers=2))
    assert not is_base_model(folder)  # tokenizer_config.json's chat_template
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    del config["chat_template"]
    config_file.write_text(json.dumps(config))
    assert is_base_model(folder)
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    assert not is_base_model(folder)
    (folder / "chat_template.json").unlink()
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    assert not is_base_model(folder)
    assert is_base_model(folder, name="org/Tiny-Base")  # a hub repo's name says so


def test_a_hub_snapshot_is_named_by_its_repo(tmp_path):
    snapshot = write_tiny_model(tmp_path / "models--org--x" / "snapshots" / "base", TinyModelSpec())
    assert not is_base_model(snapshot)  # the commit folder's name is no model's name
    assert is_base_model(snapshot, name="org/x-base")


@pytest.mark.real_model
def test_the_real_models(tmp_path):
    """gemma3-270m's GGUF has no chat template: a base model; SmolLM2-135M-Instruct and
    Qwen2.5-Coder-0.5B-Instruct carry theirs."""
    assert is_base_model(provision.ensure_model("gemma3-270m", paths.data_dir()))
    assert not is_base_model(provision.ensure_model("default", paths.data_dir()))
    if QWEN_FILE.exists():
        assert not is_base_model(QWEN_FILE)
