"""Every architecture of the GGUF table, checked against the two libraries that own the
formats: a tiny mlx-lm model written as llama.cpp's converter writes it (gguf-py's
``GGUFWriter`` and ``TensorNameMap``, tests/core/models/load/gguf_families.py) imports to a
model whose logits are mlx-lm's on the same weights: within float32 rounding for F32 files,
and for quantized files within float32 rounding of mlx-lm on the weights the gguf package
dequantizes from the same file (so within the type's own error of the unquantized model).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from mlx.utils import tree_flatten, tree_unflatten

from core.errors import ModelLoadError
from core.models.load.gguf_architectures import ARCHITECTURES
from core.models.load.gguf_import import read_gguf
from core.models.load.loader import load_model
from tests.core.models.load.gguf_families import (
    CASES,
    converted_tensors,
    model_and_config,
    quantizable,
    write_gguf,
)

# bytes of a sentence, longer than the sliding windows (16) of the tiny models
TOKENS = mx.array([list(b"The quick brown fox jumps over the lazy dog, twice. ")])
FLOAT32_TOLERANCE = 1e-4  # of the largest logit, as the cache contract's float32 bound


def test_every_architecture_of_the_table_has_a_case():
    assert set(CASES) == set(ARCHITECTURES)


def _logits(model) -> mx.array:
    out = model(TOKENS)[0].astype(mx.float32)
    mx.eval(out)
    return out


def _import(tmp_path, arch, config, model, qtype):
    """The file through the loader, in float32 (what the CPU runs)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = write_gguf(
        tmp_path / f"{arch}.gguf", arch, config, converted_tensors(arch, model, config), qtype
    )
    loaded = load_model(str(path), tmp_path / "data", "float32")
    return loaded.model, loaded


def _dequantized_model(model, qtype):
    """``model`` with each weight the file quantizes replaced by what the gguf package
    dequantizes from it (the converter's row permutation commutes with row-wise blocks)."""
    import gguf

    changed = [
        (name, mx.array(gguf.quants.dequantize(gguf.quants.quantize(data, qtype), qtype)))
        for name, value in tree_flatten(model.parameters())
        if quantizable(name, data := np.array(value.astype(mx.float32)))
    ]
    model.update(tree_unflatten(changed))
    return model


def _max_error(ours: mx.array, theirs: mx.array) -> float:
    return float(mx.abs(ours - theirs).max()) / float(mx.abs(theirs).max())


@pytest.mark.parametrize("arch", sorted(CASES))
def test_f32_file_gives_mlx_lm_logits(arch, tmp_path):
    model, config = model_and_config(arch)
    imported, loaded = _import(tmp_path, arch, config, model, Q.F32)
    assert loaded.config["model_type"] == config["model_type"]
    theirs = _logits(model)
    ours = _logits(imported)
    assert _max_error(ours, theirs) <= FLOAT32_TOLERANCE
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


@pytest.mark.parametrize("arch", sorted(CASES))
def test_quantized_files_give_mlx_lm_logits_on_their_weights(arch, tmp_path):
    """Q8_0 (read by MLX's own GGUF reader) and Q5_0 (converted through the gguf package):
    each gives mlx-lm's logits on the weights the gguf package dequantizes from the same
    file, and 8 bits stay nearer the unquantized model than 5."""
    model, config = model_and_config(arch)
    unquantized = _logits(model)
    drift = {}
    for qtype in (Q.Q8_0, Q.Q5_0):
        imported, _ = _import(tmp_path / qtype.name, arch, config, model, qtype)
        ours = _logits(imported)
        theirs = _logits(_dequantized_model(model_and_config(arch)[0], qtype))
        assert _max_error(ours, theirs) <= FLOAT32_TOLERANCE, qtype.name
        drift[qtype] = float(mx.sqrt(mx.mean((ours - unquantized) ** 2) / mx.mean(unquantized**2)))
    assert 0 < drift[Q.Q8_0] < drift[Q.Q5_0]


@pytest.mark.parametrize("arch", sorted(CASES))
def test_a_file_loads_and_chats_like_mlx_lm(arch, tmp_path):
    """Through the loader (tokenizer and template from the metadata): the greedy reply to
    a chat is mlx-lm's on the same weights."""
    from mlx_lm.generate import generate

    model, config = model_and_config(arch)
    path = write_gguf(
        tmp_path / f"{arch}.gguf", arch, config, converted_tensors(arch, model, config)
    )
    loaded = load_model(str(path), tmp_path / "data", "float32")
    assert loaded.info.model_type == config["model_type"]
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello there"}], add_generation_prompt=True
    )
    assert loaded.tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    ours = generate(loaded.model, loaded.tokenizer, prompt, max_tokens=8)
    theirs = generate(model, loaded.tokenizer, prompt, max_tokens=8)
    assert ours == theirs and len(ours) == 8


def test_llama3_rope_factors_become_its_scaling(tmp_path):
    """Llama 3.x files carry their RoPE scaling as the ``rope_freqs`` factors llama.cpp's
    converter computed; the import reads the llama3 parameters back from them."""
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    model, config = model_and_config("llama", rope_scaling=scaling)
    imported, loaded = _import(tmp_path, "llama", config, model, Q.F32)
    assert loaded.config["rope_scaling"] == scaling
    assert _max_error(_logits(imported), _logits(model)) <= FLOAT32_TOLERANCE


def test_rope_factors_no_llama3_scaling_gives_are_refused(tmp_path):
    model, config = model_and_config("llama")
    tensors = converted_tensors("llama", model, config)
    tensors["rope_freqs.weight"] = np.linspace(1.0, 3.0, config["head_dim"] // 2).astype(np.float32)
    path = write_gguf(tmp_path / "odd.gguf", "llama", config, tensors)
    with pytest.raises(ModelLoadError, match="rope_freqs factors match no llama3"):
        read_gguf(path)


def test_a_tensor_the_model_has_no_place_for_is_named(tmp_path):
    model, config = model_and_config("qwen2")
    tensors = converted_tensors("qwen2", model, config)
    tensors["blk.0.ssm_conv1d.weight"] = np.zeros((4, 64), dtype=np.float32)
    path = write_gguf(tmp_path / "extra.gguf", "qwen2", config, tensors)
    with pytest.raises(ModelLoadError, match="blk.0.ssm_conv1d.weight has no place"):
        read_gguf(path)


def test_an_unsupported_architecture_says_what_runs(tmp_path):
    model, config = model_and_config("qwen2")
    path = write_gguf(
        tmp_path / "mamba.gguf", "mamba", config, converted_tensors("qwen2", model, config)
    )
    with pytest.raises(ModelLoadError) as caught:
        read_gguf(path)
    message = str(caught.value)
    assert "'mamba' is not supported" in message
    assert all(name in message for name in ARCHITECTURES)


def test_docs_table_lists_every_architecture():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[4] / "docs" / "models.md").read_text()
    table = page.split("## GGUF architectures", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(" `") for line in table.splitlines() if line.startswith("| `")}
    assert rows == set(ARCHITECTURES)
