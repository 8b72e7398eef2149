"""GGUF import on the real default model (SmolLM2-135M-Instruct Q4_1), plus bad files."""

from __future__ import annotations

import gguf
import mlx.core as mx
import numpy as np
import pytest

from core.errors import ModelLoadError
from core.models.load.gguf_import import build_model, map_weights, read_gguf
from core.models.load.loader import load_model

pytestmark = pytest.mark.real_model

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm(default_model_file, tmp_path_factory):
    return load_model(str(default_model_file), tmp_path_factory.mktemp("data"), "float32")


def test_hyper_parameters_from_metadata(default_model_file):
    contents = read_gguf(default_model_file)
    config = contents.config
    assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
    assert config["num_attention_heads"] == 9 and config["num_key_value_heads"] == 3
    assert "rope_traditional" not in config  # Q/K rows back in the order mlx-lm rotates
    assert config["tie_word_embeddings"] is True  # no output.weight in the file
    assert config["vocab_size"] == 49152 and config["max_position_embeddings"] == 8192


def test_quantized_tensors_stay_quantized(default_model_file, tmp_path):
    stored = load_model(str(default_model_file), tmp_path, "stored")
    layer = stored.model.model.layers[0]
    assert layer.self_attn.q_proj.bits == 4 and layer.self_attn.q_proj.group_size == 32
    assert stored.model.model.embed_tokens.bits == 8  # Q8_0 embeddings
    assert stored.info.weight_bytes < 120e6  # ~4.5 bits per weight, not float32's 540 MB


def test_tokenizer_and_chat_template(smollm):
    tok = smollm.tokenizer
    text = "Hello, world! 12345 héllo"
    assert tok.decode(tok.encode(text)) == text
    prompt = tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.convert_tokens_to_ids("<|im_end|>") in tok.eos_token_ids


def test_greedy_reply_names_paris(smollm):
    from mlx_lm.generate import generate

    prompt = smollm.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    reply = generate(smollm.model, smollm.tokenizer, prompt, max_tokens=16)
    assert "Paris" in reply


def test_logits_match_gguf_package_dequantization(smollm, default_model_file):
    """Our import vs the same file dequantized by the `gguf` package through mlx-lm's llama."""
    reader = gguf.GGUFReader(str(default_model_file))
    reference_weights = {
        tensor.name: mx.array(
            gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        )
        for tensor in reader.tensors
    }
    reference = build_model(
        smollm.config, map_weights("llama", smollm.config, reference_weights, default_model_file)
    )
    tokens = mx.array(smollm.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True))[
        None
    ]
    ours = smollm.model(tokens)[0, -1]
    theirs = reference(tokens)[0, -1]
    mx.eval(ours, theirs)
    scale = float(mx.abs(theirs).max())
    assert float(mx.abs(ours - theirs).max()) <= 1e-4 * scale
    assert int(ours.argmax()) == int(theirs.argmax())


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "bert.gguf"
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="'bert' is not supported"):
        read_gguf(path)


@pytest.mark.parametrize("keep", [1_000_000, 60_000_000])
def test_truncated_gguf(default_model_file, tmp_path, keep):
    cut = tmp_path / "cut.gguf"
    with open(default_model_file, "rb") as src:
        cut.write_bytes(src.read(keep))
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        read_gguf(cut)


# Two processes building the same tokenizer cache at once. Each one, once it has written its
# file and before it moves it into place, waits (up to 30 s) for the other to get that far:
# the moment where a shared temporary name broke one of them. Test-side only: the
# conversion transformers' GGUF code returns is wrapped in the child.
BUILD_AT_ONCE = """
import os, sys, time
from pathlib import Path

import transformers.integrations.gguf.gguf_tokenizer_mapping as mapping

from core.models.load.gguf_header import read_header
from core.models.load.gguf_import import build_tokenizer

source, cache_file, barrier = map(Path, sys.argv[1:4])
convert = mapping.convert_gguf_tokenizer


class SavesThenWaits:
    def __init__(self, backend):
        self.backend = backend

    def save(self, path, *args, **kwargs):
        self.backend.save(path, *args, **kwargs)
        (barrier / str(os.getpid())).touch()
        deadline = time.monotonic() + 30
        while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)


def converted(*args, **kwargs):
    backend, extra = convert(*args, **kwargs)
    return SavesThenWaits(backend), extra


mapping.convert_gguf_tokenizer = converted
tokenizer = build_tokenizer(read_header(source).metadata, cache_file)
print(tokenizer.encode("The capital of France is Paris."))
"""


@pytest.mark.faults
def test_two_processes_building_the_same_tokenizer_at_once(default_model_file, tmp_path):
    """Today: one of them died on the shared ``tokenizers/<sha>.tmp`` (FileNotFoundError)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[4]
    cache_file = tmp_path / "tokenizers" / "smollm.json"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    command = [
        sys.executable,
        "-c",
        BUILD_AT_ONCE,
        str(default_model_file),
        str(cache_file),
        str(barrier),
    ]
    env = {**os.environ, "PYTHONPATH": str(root)}
    children = [
        subprocess.Popen(
            command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [child.communicate(timeout=300) for child in children]
    assert [child.returncode for child in children] == [0, 0], [err[-2000:] for _, err in results]
    assert len(list(barrier.iterdir())) == 2  # both did write their file before either moved it
    (first, _), (second, _) = results
    assert first == second and first.startswith("[")
    # no temporary file left
    assert sorted(p.name for p in cache_file.parent.iterdir()) == ["smollm.json"]


@pytest.mark.faults
def test_two_processes_importing_the_same_new_gguf_at_once(default_model_file, tmp_path):
    """The whole load, twice at once into one fresh data folder: both load, and agree."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[4]
    code = (
        "import sys; from pathlib import Path; from core.models.load.loader import load_model; "
        "loaded = load_model(sys.argv[1], Path(sys.argv[2]), 'stored'); "
        "print(loaded.info.fingerprint, loaded.tokenizer.encode('The capital of France is Paris.'))"
    )
    command = [sys.executable, "-c", code, str(default_model_file), str(tmp_path / "data")]
    env = {**os.environ, "PYTHONPATH": str(root)}
    children = [
        subprocess.Popen(
            command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [child.communicate(timeout=300) for child in children]
    assert [child.returncode for child in children] == [0, 0], [err[-2000:] for _, err in results]
    assert results[0][0] == results[1][0]
    assert [p.suffix for p in (tmp_path / "data" / "tokenizers").iterdir()] == [".json"]
