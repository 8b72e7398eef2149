"""Chat templates: a user's own (``--chat-template FILE``) and the tool-call markup a
template implies.

mlx-lm picks a model's tool-call parser from its chat template when it loads a folder
(``mlx_lm.tokenizer_utils.load``); a tokenizer rebuilt from GGUF metadata, or given
another template, gets the same inference here, so ``tokenizer.has_tool_calling``,
``tool_parser``, ``tool_call_start`` and ``tool_call_end`` say what the template writes.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from core.errors import UserError

# A tool-capable template for the default model (SmolLM2's own ChatML plus Hermes-style
# <tool_call> markup; the same text as the original when no tools are given).
SMOLLM2_TOOLS_TEMPLATE = "smollm2_tools.jinja"


def read_chat_template(path: str | Path) -> str:
    """The Jinja text of a chat template file, or a clear error."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the chat template {path}: {exc}") from None
    if "messages" not in text:
        raise UserError(f"{path} is not a chat template (it never reads `messages`)")
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        ImmutableSandboxedEnvironment().parse(text)
    except Exception as exc:  # noqa: BLE001 - jinja2's TemplateSyntaxError and friends
        raise UserError(f"{path} is not a valid Jinja template: {exc}") from None
    return text


def shipped_template(name: str) -> str:
    """A chat template that ships in ``resources/``."""
    from resources import resource_path

    return resource_path(name).read_text(encoding="utf-8")


def tool_calling(hf_tokenizer) -> dict:
    """mlx-lm's tool-call fields for a Hugging Face tokenizer's current chat template
    (``TokenizerWrapper`` keyword arguments; all None when it writes no tool calls)."""
    from core.mlx_lm_compat import infer_tool_parser  # the table mlx-lm's own load uses

    kind = infer_tool_parser(hf_tokenizer) if hf_tokenizer.chat_template else None
    if kind is None:
        return {"tool_parser": None, "tool_call_start": None, "tool_call_end": None}
    module = importlib.import_module(f"mlx_lm.tool_parsers.{kind}")
    return {
        "tool_parser": module.parse_tool_call,
        "tool_call_start": module.tool_call_start,
        "tool_call_end": module.tool_call_end,
    }


def with_chat_template(tokenizer, template: str):
    """A ``TokenizerWrapper`` like ``tokenizer`` that renders with ``template`` and parses
    the tool calls it implies (same vocabulary, detokenizer and end-of-sequence tokens)."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    from core.mlx_lm_compat import hf_tokenizer

    hf = hf_tokenizer(tokenizer)
    hf.chat_template = template
    detokenizer = tokenizer.detokenizer
    return TokenizerWrapper(
        hf,
        lambda _hf: detokenizer,
        eos_token_ids=sorted(tokenizer.eos_token_ids),
        **tool_calling(hf),
    )
