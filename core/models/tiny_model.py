"""Tiny random-weight language models, written as ordinary MLX model directories.

Tests (and ``radixchat --self-test``) need real mlx-lm models without a download.
:func:`write_tiny_model` writes ``config.json``, ``model.safetensors`` and a byte-level
tokenizer with a ChatML template; ``mlx_lm.utils.load(path)`` loads the result like any
downloaded model. These kinds cover the cache layouts the engine must handle:

- ``"llama"``: mlx-lm ``llama``, every layer full attention (``KVCache``);
- ``"sliding"``: mlx-lm ``gemma3_text``, sliding-window layers (``RotatingKVCache``)
  alternating with global ones (``KVCache``);
- ``"recurrent"``: mlx-lm ``qwen3_next``, gated-delta linear-attention layers
  (``ArraysCache``) alternating with full attention (``KVCache``);
- ``"llama-sliding"``: mlx-lm ``llama`` with sliding-window layers alternating with full
  ones (its ``layer_types``): a hybrid model mlx-lm can split over machines (``shard``);
- ``"qwen2"``: mlx-lm ``qwen2``, every layer full attention: a dense model mlx-lm can split
  both ways over machines (``shard`` and ``pipeline``; ``llama`` has no pipeline split).

Weights come from ``mx.random.key(spec.seed)`` alone, so one spec always gives the same
bytes. Linear layers are drawn with std ``1/sqrt(fan_in)`` and the output head a few times
larger, so greedy decoding has clear top-1 margins and follows the prompt. Only printable
ASCII and newline get nonzero output rows (logit std ~4; every other id, the special tokens
included, has logit 0): greedy replies are readable ASCII, whole UTF-8 by construction, and
run to ``max_tokens``; sampling picks another id rarely (well under 1% a step).

A spec with ``thinking`` adds ``<think>`` and ``</think>`` to the vocabulary (ids 259 and
260, added tokens that are not special, as Qwen3 has them), so mlx-lm's tokenizer wrapper
sees a reasoning model (``has_thinking``); ``write_tiny_model(..., chat_template=...)``
gives the model another template (a real one, such as Qwen3's, which thinks).
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

KINDS = ("llama", "sliding", "recurrent", "llama-sliding", "qwen2")
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 256, 257, 258
BYTE_VOCAB_SIZE = 256
VOCAB_SIZE = BYTE_VOCAB_SIZE + len(SPECIAL_TOKENS)
EOS_TOKEN_IDS = [BYTE_VOCAB_SIZE + 2, BYTE_VOCAB_SIZE]  # <|im_end|>, <|endoftext|>
THINK_TOKENS = ("<think>", "</think>")  # ids 259, 260 in a spec with ``thinking``

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LM_HEAD_GAIN = 4.0  # logits of std ~4: clear greedy winners, peaked sampling


@dataclass(frozen=True)
class TinyModelSpec:
    """What to generate. ``num_layers`` must be even for "sliding" and "recurrent",
    whose layers alternate between the two kinds (sliding/linear first)."""

    kind: str = "llama"  # "llama" | "sliding" | "recurrent" | "llama-sliding" | "qwen2"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 512
    seed: int = 0
    dtype: str = "float32"
    sliding_window: int = 16  # "sliding", "llama-sliding": tokens a sliding layer keeps
    thinking: bool = False  # <think> and </think> in the vocabulary (a reasoning model's)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.kind!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, not {self.dtype!r}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("hidden_size % num_heads and num_heads % num_kv_heads must be 0")
        if self.kind not in ("llama", "qwen2") and (self.num_layers < 2 or self.num_layers % 2):
            raise ValueError(f"kind {self.kind!r} needs an even num_layers >= 2")
        if self.num_layers < 1:
            raise ValueError("num_layers must be >= 1")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE + (len(THINK_TOKENS) if self.thinking else 0)


def model_config(spec: TinyModelSpec) -> dict:
    """The ``config.json`` contents for ``spec``."""
    common = {
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": False,
        "eos_token_id": EOS_TOKEN_IDS,
        "pad_token_id": BYTE_VOCAB_SIZE,
        "torch_dtype": spec.dtype,
        "radixchat_tiny_model": asdict(spec),
    }
    half = spec.num_layers // 2
    if spec.kind == "qwen2":
        return {
            "model_type": "qwen2",
            "architectures": ["Qwen2ForCausalLM"],
            **common,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
        }
    if spec.kind in ("llama", "llama-sliding"):
        sliding = (
            {
                "sliding_window": spec.sliding_window,
                "layer_types": ["sliding_attention", "full_attention"] * half,
            }
            if spec.kind != "llama"
            else {}
        )
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            **common,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            **sliding,
        }
    if spec.kind == "sliding":
        return {
            "model_type": "gemma3_text",
            "architectures": ["Gemma3ForCausalLM"],
            **common,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "rope_local_base_freq": 10000.0,
            "query_pre_attn_scalar": spec.head_dim,
            "sliding_window": spec.sliding_window,
            "sliding_window_pattern": 2,
            "layer_types": ["sliding_attention", "full_attention"] * half,
        }
    return {
        "model_type": "qwen3_next",
        "architectures": ["Qwen3NextForCausalLM"],
        **common,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "full_attention_interval": 2,
        "layer_types": ["linear_attention", "full_attention"] * half,
        "linear_num_key_heads": spec.num_kv_heads,
        "linear_num_value_heads": spec.num_heads,
        "linear_key_head_dim": spec.head_dim,
        "linear_value_head_dim": spec.head_dim,
        "linear_conv_kernel_dim": 4,
        "num_experts": 0,
        "num_experts_per_tok": 0,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 0,
        "shared_expert_intermediate_size": 0,
    }


def write_tiny_model(
    path: Path, spec: TinyModelSpec = TinyModelSpec(), chat_template: str = CHAT_TEMPLATE
) -> Path:
    """Write a loadable MLX model directory for ``spec`` at ``path``, with ``chat_template``
    (ChatML by default); return ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = model_config(spec)
    weights = random_weights(spec, config)
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    _write_json(path / "config.json", config)
    _write_json(
        path / "generation_config.json",
        {"eos_token_id": EOS_TOKEN_IDS, "pad_token_id": BYTE_VOCAB_SIZE},
    )
    write_tokenizer_files(
        path,
        spec.max_position_embeddings,
        chat_template,
        THINK_TOKENS if spec.thinking else (),
    )
    return path


def random_weights(spec: TinyModelSpec, config: dict) -> dict[str, mx.array]:
    """Seeded weights under the names the mlx-lm model of ``config`` loads."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    shapes = {name: tuple(p.shape) for name, p in tree_flatten(model.parameters())}
    names = sorted(shapes)
    keys = mx.random.split(mx.random.key(spec.seed), len(names))
    norm_value = 0.0 if spec.kind == "sliding" else 1.0  # gemma's RMSNorm adds 1 itself
    weights = {}
    for key, name in zip(keys, names):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            value = mx.full(shape, norm_value)
        elif name.endswith("A_log"):  # gated-delta decay rates, as Qwen3-Next draws them
            value = mx.log(mx.random.uniform(1.0, 16.0, shape, key=key))
        elif name.endswith("dt_bias") or name.endswith(".bias"):
            value = mx.zeros(shape)
        elif name == "lm_head.weight":
            value = mx.random.normal(shape, key=key) * (LM_HEAD_GAIN / math.sqrt(shape[1]))
            value = value * _emittable_mask(shape[0])[:, None]
        elif name.endswith("embed_tokens.weight"):  # unit-scale rows as the model sees them
            std = 1 / math.sqrt(shape[1]) if spec.kind == "sliding" else 1.0  # gemma: * sqrt(h)
            value = mx.random.normal(shape, key=key) * std
        else:  # linear (out, in) and depthwise conv (out, kernel, 1)
            fan_in = math.prod(shape[1:])
            value = mx.random.normal(shape, key=key) / math.sqrt(fan_in)
        weights[name] = value.astype(DTYPES[spec.dtype])
    mx.eval(weights)
    return weights


def _emittable_mask(vocab_size: int = VOCAB_SIZE) -> mx.array:
    """1 for the ids the output head favours (printable ASCII and newline), else 0."""
    emittable = [i == 10 or 32 <= i <= 126 for i in range(vocab_size)]
    return mx.array(emittable, dtype=mx.float32)


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode map: the printable symbol of byte ``i`` at index ``i``."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[byte] for byte in range(256)]


def build_tokenizer(added: tuple[str, ...] = ()):
    """A ``tokenizers.Tokenizer``: one token per UTF-8 byte, plus the special tokens, then
    the ``added`` ones (not special: they decode as text, as Qwen3's ``<think>`` does)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {symbol: i for i, symbol in enumerate(byte_alphabet())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    if added:
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tokenizer


def write_tokenizer_files(
    path: Path,
    model_max_length: int,
    chat_template: str = CHAT_TEMPLATE,
    added_tokens: tuple[str, ...] = (),
) -> None:
    """The byte tokenizer, its special tokens (then ``added_tokens``, not special) and
    ``chat_template`` (ChatML by default), into model folder ``path``."""
    build_tokenizer(added_tokens).save(str(path / "tokenizer.json"))
    added = {
        str(BYTE_VOCAB_SIZE + i): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": i < len(SPECIAL_TOKENS),
        }
        for i, token in enumerate(SPECIAL_TOKENS + added_tokens)
    }
    _write_json(
        path / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": added,
            "bos_token": None,
            "eos_token": IM_END,
            "pad_token": ENDOFTEXT,
            "unk_token": None,
            "additional_special_tokens": [IM_START, IM_END],
            "chat_template": chat_template,
            "clean_up_tokenization_spaces": False,
            "model_max_length": model_max_length,
        },
    )
    _write_json(
        path / "special_tokens_map.json",
        {
            "eos_token": IM_END,
            "pad_token": ENDOFTEXT,
            "additional_special_tokens": [IM_START, IM_END],
        },
    )


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
