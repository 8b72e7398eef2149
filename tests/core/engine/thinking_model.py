"""A tiny reasoning model that always thinks and answers the same way, for the tests of
reasoning models (the engine's, the API's, the chat's).

The tiny llama model of ``core.models.tiny_model`` with ``<think>`` and ``</think>`` in its
vocabulary and Qwen3's real chat template (``templates/qwen3.jinja``: the template of
Qwen/Qwen3-8B, which drops earlier turns' thinking and takes ``enable_thinking``), its
weights then scripted: every layer's output projections are zero, so the last hidden state
is the embedding of the last token, and the output head maps the embedding of each token
of :data:`SCRIPT` to the next one. The model is a chain of bigrams: after the generation
prompt's last token (``\\n`` of ``<|im_start|>assistant\\n``) it writes
``<think>Hm</think>OK<|im_end|>``, at any temperature (the next token's logit is ~64, every
other's at most ~20). Its reply does not depend on a random model's choice.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from core.models.tiny_model import BYTE_VOCAB_SIZE, TinyModelSpec, write_tiny_model

QWEN3_TEMPLATE = (Path(__file__).parent / "templates" / "qwen3.jinja").read_text(encoding="utf-8")
# Qwen3's template, its generation prompt opening the thinking (DeepSeek-R1's and
# Qwen3-Thinking's way): the reply starts inside <think>
OPENING_TEMPLATE = QWEN3_TEMPLATE.replace(
    "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>' }}"
)
THINK, END_THINK, IM_END = BYTE_VOCAB_SIZE + 3, BYTE_VOCAB_SIZE + 4, BYTE_VOCAB_SIZE + 2
THINKING, ANSWER = "Hm", "OK"
SCRIPT = (ord("\n"), THINK, *map(ord, THINKING), END_THINK, *map(ord, ANSWER), IM_END)
REPLY_TOKENS = len(SCRIPT) - 1  # <think> H m </think> O K <|im_end|>
THINKING_TOKENS = 2 + len(THINKING)  # the markers and the thinking


def write_thinking_model(path: Path, chat_template: str = QWEN3_TEMPLATE, **spec) -> Path:
    """The scripted reasoning model (see the module docstring) at ``path``."""
    path = write_tiny_model(path, TinyModelSpec(thinking=True, **spec), chat_template)
    weights = dict(mx.load(str(path / "model.safetensors")))
    for name, value in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = mx.zeros_like(value)
    embeddings = weights["model.embed_tokens.weight"]
    head = mx.zeros_like(weights["lm_head.weight"])
    for token, following in zip(SCRIPT, SCRIPT[1:]):
        row = embeddings[token]
        head[following] = row / mx.sqrt(mx.mean(row * row))  # as the final RMSNorm gives it
    weights["lm_head.weight"] = head
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    return path
