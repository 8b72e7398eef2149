import json
import time

# After core, which prepares MLX's CPU backend before mlx is first imported.
import mlx.core as mx
import pytest
from mlx_lm.generate import generate
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache
from mlx_lm.utils import load

from core.models.tiny_model import (
    CHAT_TEMPLATE,
    EOS_TOKEN_IDS,
    KINDS,
    VOCAB_SIZE,
    TinyModelSpec,
    byte_alphabet,
    write_tiny_model,
)

SPECS = {kind: TinyModelSpec(kind=kind, num_layers=4) for kind in KINDS}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """kind -> (path, model, tokenizer), written and loaded once for the module."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        kind: (path, *load(str(path)))
        for kind, spec in SPECS.items()
        for path in [write_tiny_model(root / kind, spec)]
    }


@pytest.mark.parametrize("kind", KINDS)
def test_write_and_load_are_fast(tmp_path, kind):
    start = time.perf_counter()
    path = write_tiny_model(tmp_path / kind, TinyModelSpec(kind=kind))
    written = time.perf_counter()
    model, tokenizer = load(str(path))
    loaded_at = time.perf_counter()
    assert written - start < 1.0
    assert loaded_at - written < 2.0
    assert len(model.layers) == 2
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (path / name).is_file()


@pytest.mark.parametrize(
    "kind, model_type",
    [
        ("llama", "llama"),
        ("sliding", "gemma3_text"),
        ("recurrent", "qwen3_next"),
        ("qwen2", "qwen2"),
    ],
)
def test_config_names_the_mlx_lm_model(loaded, kind, model_type):
    path, model, _ = loaded[kind]
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == model_type
    assert config["vocab_size"] == VOCAB_SIZE
    assert config["tie_word_embeddings"] is False
    assert model.model_type == model_type
    assert len(model.layers) == SPECS[kind].num_layers


def test_llama_cache_is_all_kv(loaded):
    _, model, _ = loaded["llama"]
    assert [type(c) for c in model.make_cache()] == [KVCache] * 4


def test_sliding_cache_mixes_rotating_and_full(loaded):
    _, model, _ = loaded["sliding"]
    caches = model.make_cache()
    assert [type(c) for c in caches] == [RotatingKVCache, KVCache] * 2
    assert caches[0].max_size == SPECS["sliding"].sliding_window


def test_recurrent_cache_mixes_arrays_and_full(loaded):
    _, model, _ = loaded["recurrent"]
    assert [type(c) for c in model.make_cache()] == [ArraysCache, KVCache] * 2


@pytest.mark.parametrize("kind", KINDS)
def test_generate_runs(loaded, kind):
    _, model, tokenizer = loaded[kind]
    text = generate(model, tokenizer, "hello there", max_tokens=8)
    assert isinstance(text, str) and text


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_reply_follows_the_prompt(loaded, kind):
    _, model, tokenizer = loaded[kind]
    prompts = ["hello", "the quick brown fox", "12345", "What is MLX?"]
    replies = {generate(model, tokenizer, p, max_tokens=8) for p in prompts}
    assert len(replies) > 1
    assert all(r.isascii() and len(r) == 8 for r in replies)  # no special token, whole ASCII


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_with_cache_matches_full_forward(loaded, kind):
    _, model, tokenizer = loaded[kind]
    ids = mx.array([tokenizer.encode("a longer prompt than the sliding window of sixteen")])
    full = model(ids)[0, -1]
    cache = make_prompt_cache(model)  # qwen2 has no make_cache of its own
    model(ids[:, :-1], cache=cache)
    stepped = model(ids[:, -1:], cache=cache)[0, -1]
    assert mx.all(mx.isfinite(full)).item()
    assert mx.allclose(full, stepped, rtol=1e-4, atol=1e-4).item()


@pytest.mark.parametrize("text", ["hello", "héllo 🌍", "two\nlines\n\n  indented\ttab", "日本語 ✓"])
def test_tokenizer_round_trips_utf8(loaded, text):
    _, _, tokenizer = loaded["llama"]
    ids = tokenizer.encode(text)
    assert ids == list(text.encode("utf-8"))  # one token per byte, id == byte
    assert tokenizer.decode(ids) == text


def test_special_tokens(loaded):
    _, _, tokenizer = loaded["llama"]
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        256,
        257,
        258,
    ]
    assert tokenizer.encode("<|im_start|>user<|im_end|>") == [257, *b"user", 258]
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token_ids == set(EOS_TOKEN_IDS)


def test_chat_template_is_chatml(loaded):
    _, _, tokenizer = loaded["sliding"]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "héllo 🌍\nbye"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nhéllo 🌍\nbye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    bare = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=False, tokenize=False)
    assert bare == "<|im_start|>system\nBe brief.<|im_end|>\n"
    assert tokenizer.chat_template == CHAT_TEMPLATE


@pytest.mark.parametrize("kind", KINDS)
def test_same_spec_gives_same_bytes(tmp_path, kind):
    spec = TinyModelSpec(kind=kind, seed=3)
    first = write_tiny_model(tmp_path / "a", spec) / "model.safetensors"
    second = write_tiny_model(tmp_path / "b", spec) / "model.safetensors"
    other = write_tiny_model(tmp_path / "c", TinyModelSpec(kind=kind, seed=4))
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() != (other / "model.safetensors").read_bytes()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dtype_is_kept(tmp_path, dtype):
    path = write_tiny_model(tmp_path, TinyModelSpec(kind="recurrent", dtype=dtype))
    model, _ = load(str(path))
    assert model.model.embed_tokens.weight.dtype == getattr(mx, dtype)


def test_byte_alphabet_is_gpt2s():
    alphabet = byte_alphabet()
    assert len(set(alphabet)) == 256
    assert alphabet[ord("a")] == "a" and alphabet[ord(" ")] == "Ġ" and alphabet[10] == "Ċ"


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "mamba"},
        {"dtype": "int8"},
        {"num_heads": 3},
        {"kind": "sliding", "num_layers": 3},
        {"kind": "recurrent", "num_layers": 1},
    ],
)
def test_bad_spec_is_refused(bad):
    with pytest.raises(ValueError):
        TinyModelSpec(**bad)
