"""What the three dialects share about reasoning models: the chat template's variables a
request may set, and how a request's reasoning switch reaches the template.

A reasoning model's template reads its switches as variables: Qwen3's ``enable_thinking``
(false: the generation prompt closes an empty ``<think></think>``, so the model answers at
once), gpt-oss's ``reasoning_effort``. A request sets them through
``chat_template_kwargs`` (chat completions, as vLLM and llama.cpp take it), OpenAI's
``reasoning_effort`` / Responses' ``reasoning.effort`` (:func:`effort_kwargs`) or
Anthropic's ``thinking`` (:func:`thinking_kwargs`). A template that reads no such variable
ignores it. No HTTP and no engine here.
"""

from __future__ import annotations

from typing import Any

from core.api.errors import invalid

# apply_chat_template's own arguments: a request's variables may not replace them
RESERVED = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
THINKING_SWITCH = "enable_thinking"  # Qwen3's (mlx-lm passes the same name)
EFFORT = "reasoning_effort"  # gpt-oss's
NO_EFFORT = "none"  # an effort that asks for no thinking at all


def template_kwargs(kwargs: dict[str, Any] | None, param: str) -> dict[str, Any]:
    """A request's own template variables (``param`` names its field), checked: a name of
    ``apply_chat_template``'s own arguments is a 400 naming it."""
    kwargs = dict(kwargs or {})
    for name in kwargs:
        if name in RESERVED:
            raise invalid(
                f"{param}.{name}",
                f"'{param}.{name}' is an argument of the chat template renderer itself, "
                "not a template variable",
            )
    return kwargs


def effort_kwargs(effort: str | None) -> dict[str, Any]:
    """The template variables for a reasoning effort: ``reasoning_effort`` as asked (gpt-oss
    writes it into its system message), and, for ``"none"``, thinking switched off."""
    if effort is None:
        return {}
    kwargs: dict[str, Any] = {EFFORT: effort}
    if effort == NO_EFFORT:
        kwargs[THINKING_SWITCH] = False
    return kwargs


def thinking_kwargs(enabled: bool) -> dict[str, Any]:
    """The template variables for thinking switched on or off (Anthropic's ``thinking``)."""
    return {THINKING_SWITCH: enabled}
