"""GGUF import of Gemma 3 270M (Q4_K_M: Q8_0, Q5_0, Q4_K, Q6_K and F32 tensors).

The file is the base model: greedy completion is checked on a prompt it gets right. The
reference for the logits is independent of our conversion: ``gguf.GGUFReader`` +
``gguf.quants.dequantize`` and a hand-written config into mlx-lm's ``gemma3_text``; only
the tensor name mapping is shared. One data folder serves the whole session, so the
conversion and the tokenizer build happen once.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models import gemma3_text
from mlx_lm.models.cache import KVCache, RotatingKVCache

from core import paths
from core.errors import ModelLoadError
from core.models.load import gguf_import
from core.models.load.gguf_architectures import ARCHITECTURES
from core.models.load.gguf_convert import ConversionCache
from core.models.load.gguf_import import build_model, read_gguf
from core.models.load.gguf_names import name_table
from core.models.load.loader import load_model
from core.models.pypi import provision

real_model = pytest.mark.real_model
SENTENCE = (
    "The Eiffel Tower is located in the city of Paris, France. It was built for the 1889 "
    "World's Fair and is one of the most visited monuments in the world."
)
GLOBAL_LAYERS = [5, 11, 17]  # every 6th layer attends globally


@pytest.fixture(scope="session")
def gemma_file() -> Path:
    return provision.ensure_model("gemma3-270m", paths.data_dir())


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gemma-data")


@pytest.fixture(scope="module")
def gemma(gemma_file, data_root):
    return load_model(str(gemma_file), data_root, "float32")


@pytest.fixture(scope="module")
def reference(gemma_file):
    """The same file through the `gguf` package, Gemma 3 270M's published config and mlx-lm."""
    config = dict(
        model_type="gemma3_text",
        hidden_size=640,
        num_hidden_layers=18,
        intermediate_size=2048,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        rms_norm_eps=1e-6,
        vocab_size=262144,
        rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0,
        query_pre_attn_scalar=256,
        sliding_window=512,
        sliding_window_pattern=6,
        max_position_embeddings=32768,
    )
    names = name_table(ARCHITECTURES["gemma3"], config)  # gguf-py's names, as llama.cpp's
    weights = {}
    for tensor in gguf.GGUFReader(str(gemma_file)).tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if tensor.name.endswith("norm.weight"):
            values = values - 1.0  # the GGUF stores Gemma's RMSNorm weights as 1 + w
        module, _, kind = tensor.name.rpartition(".")
        weights[f"{names[module]}.{kind}"] = mx.array(values)
    model = gemma3_text.Model(gemma3_text.ModelArgs(**config))
    model.load_weights(list(model.sanitize(weights).items()), strict=True)
    mx.eval(model.parameters())
    return model


def _cache(data_root: Path, layout: str = "float32") -> ConversionCache:
    """The file's conversion cache, keeping every conversion (the loader's keeps slow ones)."""
    sha = provision.KNOWN_MODELS["gemma3-270m"].sha256
    return ConversionCache.under(data_root, sha, layout, keep_after_s=0.0)


@real_model
def test_config_from_metadata(gemma):
    config = gemma.config
    assert config["model_type"] == "gemma3_text"
    assert config["num_hidden_layers"] == 18 and config["hidden_size"] == 640
    assert config["num_attention_heads"] == 4 and config["num_key_value_heads"] == 1
    assert config["head_dim"] == 256 and config["query_pre_attn_scalar"] == 256
    assert config["sliding_window"] == 512 and config["sliding_window_pattern"] == 6
    assert config["rope_theta"] == 1_000_000.0 and config["rope_local_base_freq"] == 10_000.0
    assert config["vocab_size"] == 262144 and config["max_position_embeddings"] == 32768
    assert config["intermediate_size"] == 2048 and config["tie_word_embeddings"] is True
    assert [
        i for i, layer in enumerate(gemma.model.layers) if not layer.self_attn.is_sliding
    ] == GLOBAL_LAYERS
    assert gemma.model.model.embed_tokens.weight.dtype == mx.float32


@real_model
def test_sliding_layers_get_rotating_caches(gemma):
    caches = gemma.model.make_cache()
    assert len(caches) == 18
    for i, cache in enumerate(caches):
        if i in GLOBAL_LAYERS:
            assert type(cache) is KVCache
        else:
            assert isinstance(cache, RotatingKVCache) and cache.max_size == 512


@real_model
def test_tokenizer(gemma):
    tok = gemma.tokenizer
    assert tok.encode("The capital of France is") == [2, 818, 5279, 529, 7001, 563]  # <bos> first
    for text in (
        "Hello, world! 12345 héllo",
        "  two leading spaces\n\nand\ttabs",
        "日本語 and emoji 🙂",
    ):
        ids = tok.encode(text, add_special_tokens=False)
        assert 2 not in ids and tok.decode(ids) == text
    ids = tok.encode("<start_of_turn>user\nhi<end_of_turn>")
    assert ids.count(2) == 1 and tok.convert_tokens_to_ids("<start_of_turn>") in ids
    eos = {tok.convert_tokens_to_ids(t) for t in ("<eos>", "<end_of_turn>")}
    assert set(tok.eos_token_ids) == eos  # not "</s>", a plain token in Gemma's vocabulary


@real_model
def test_chat_template_uses_gemma_turns(gemma):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Capital of France?"},
    ]
    prompt = gemma.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert prompt == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nCapital of France?<end_of_turn>\n<start_of_turn>model\n"
    )
    ids = gemma.tokenizer.apply_chat_template(messages[1:2], add_generation_prompt=True)
    assert ids[:2] == [2, 105] and ids.count(2) == 1


@real_model
def test_greedy_completion(gemma):
    """The 270M base model completes this one right (for "The capital of France is" its
    first choice is " the", with " Paris" third)."""
    from mlx_lm.generate import generate

    reply = generate(
        gemma.model, gemma.tokenizer, "The Eiffel Tower is located in the city of", max_tokens=6
    )
    assert reply.startswith(" Paris")


@real_model
def test_logits_match_gguf_package_dequantization(gemma, reference):
    tokens = mx.array(gemma.tokenizer.encode(SENTENCE))[None]
    ours, theirs = gemma.model(tokens)[0], reference(tokens)[0]
    mx.eval(ours, theirs)
    # different computations (our conversion's weights against the gguf package's): within
    # float32 rounding, and the same greedy token at every position
    scale = float(mx.abs(theirs).max())
    assert float(mx.abs(ours - theirs).max()) <= 1e-4 * scale
    assert mx.array_equal(ours.argmax(axis=-1), theirs.argmax(axis=-1))


@real_model
def test_rope_is_neox_not_interleaved(reference, gemma):
    """llama.cpp does not permute Gemma's Q/K rows: NeoX RoPE (mlx-lm's gemma3_text) fits
    the weights, the interleaved RoPE a llama import needs doubles the loss."""
    tokens = mx.array(gemma.tokenizer.encode(SENTENCE))[None]

    def loss() -> float:
        logits = reference(tokens[:, :-1])[0]
        return float(nn.losses.cross_entropy(logits, tokens[0, 1:]).mean())

    neox = loss()
    saved = [layer.self_attn.rope for layer in reference.layers]
    try:
        for layer, rope in zip(reference.layers, saved):
            layer.self_attn.rope = nn.RoPE(rope.dims, traditional=True, base=rope.base)
        interleaved = loss()
    finally:
        for layer, rope in zip(reference.layers, saved):
            layer.self_attn.rope = rope
    assert neox < 2.0 and interleaved > 1.5 * neox


@real_model
def test_conversion_cache_is_reused(gemma, gemma_file, data_root, monkeypatch):
    cache = _cache(data_root)
    if not cache.folder.exists():  # the loader kept none: its conversion was quick
        read_gguf(gemma_file, cache)
    meta = json.loads((cache.folder / "meta.json").read_text())
    assert meta["source_sha256"] == provision.KNOWN_MODELS["gemma3-270m"].sha256
    assert meta["tensor_count"] == 236

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again instead of using the cache")

    monkeypatch.setattr(gguf_import, "convert_tensors", no_conversion)  # reused, not converted
    again = load_model(str(gemma_file), data_root, "float32")
    assert again.info.fingerprint == gemma.info.fingerprint
    tokens = mx.array(gemma.tokenizer.encode("Hello there"))[None]
    # the same computation (the same weights, read back from the conversion cache, through
    # the same forward): the same bits
    assert mx.array_equal(again.model(tokens), gemma.model(tokens))


@real_model
def test_damaged_cache_entry_is_rebuilt(gemma, gemma_file, data_root):
    """Same size, new bytes: caught by the re-hash a changed mtime triggers."""
    cache = _cache(data_root)
    with open(cache.folder / "weights.safetensors", "r+b") as f:
        f.seek(100_000_000)
        block = f.read(4096)
        f.seek(100_000_000)
        f.write(bytes(b ^ 0xFF for b in block))
    contents = read_gguf(gemma_file, cache)
    assert cache.load(contents.config) is not None  # whole again
    for name, value in contents.weights.items():
        assert mx.array_equal(value, _parameter(gemma.model, name)), name


def _parameter(model: nn.Module, dotted: str) -> mx.array:
    value = model
    for part in dotted.split("."):
        value = value[int(part)] if part.isdigit() else getattr(value, part)
    return value


@real_model
def test_affine_layout_keeps_the_file_quantization(gemma, gemma_file, tmp_path):
    """The Metal layout: Q5_0 / Q4_K / Q8_0 stay quantized (5, 4, 8 bits) bit for bit;
    Q6_K (no MLX layout) is re-quantized to 8 bits."""
    contents = read_gguf(gemma_file, _cache(tmp_path, "affine"))
    model = build_model(contents.config, dict(contents.weights))
    attn, exact = model.layers[0].self_attn, gemma.model.layers[0].self_attn
    assert (attn.q_proj.bits, attn.o_proj.bits, attn.v_proj.bits) == (5, 4, 8)  # Q5_0, Q4_K, Q8_0
    # Q6_K, Q8_0
    assert model.layers[0].mlp.down_proj.bits == 8 and model.model.embed_tokens.bits == 8
    for module, reference in (
        (attn.q_proj, exact.q_proj),
        (attn.o_proj, exact.o_proj),
        (attn.v_proj, exact.v_proj),
    ):
        values = mx.dequantize(
            module.weight,
            module.scales.astype(mx.float32),
            module.biases.astype(mx.float32),
            group_size=module.group_size,
            bits=module.bits,
        )
        assert mx.array_equal(values, reference.weight)
    tokens = mx.array(gemma.tokenizer.encode("The Eiffel Tower is located in the city of"))[None]
    assert (
        int(model(tokens)[0, -1].argmax())
        == gemma.tokenizer.encode(" Paris", add_special_tokens=False)[0]
    )


@real_model
def test_truncated_file(gemma_file, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(gemma_file, "rb") as src:
        cut.write_bytes(src.read(120_000_000))
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        read_gguf(cut, _cache(tmp_path))
