"""What a loaded model's chat template and tokenizer say about the model, as plain values: the
template's text, whether it takes tools, whether (and how) the model reasons, the text of its
end-of-turn tokens. Front ends that describe a model read them (Ollama's ``/api/show``:
template, capabilities, stop parameters) and split a reasoning model's thought from its
answer with the markers. Worked out once per load, off the engine thread (the tokenizer
is not MLX; nothing here imports mlx).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

# what a template that switches reasoning on and off reads (Qwen 3, DeepSeek, gpt-oss...)
THINKING_SWITCHES = ("enable_thinking", "reasoning_content", "thinking")


@dataclass(frozen=True)
class TemplateFacts:
    """A loaded model's chat template and tokenizer, described."""

    template: str = ""  # the chat template's Jinja text ("" without one)
    takes_tools: bool = False  # the template reads ``tools``
    # the markers around a reasoning model's thought (None: the model does not reason)
    think_start: str | None = None
    think_end: str | None = None
    # the generation prompt already opens the thought: the reply starts inside it
    opens_thinking: bool = False
    stop_words: tuple[str, ...] = ()  # the text of the tokens that end a turn
    vocab_size: int = 0

    @property
    def reasons(self) -> bool:
        return self.think_start is not None and self.think_end is not None


def template_text(tokenizer) -> str:
    """The tokenizer's chat template as text (a dict of named templates: its default)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()), None)
    return template if isinstance(template, str) else ""


def reads_variable(template: str, name: str) -> bool:
    """Whether the Jinja ``template`` reads the variable ``name`` (False if it does not parse)."""
    if not template:
        return False
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        return name in meta.find_undeclared_variables(
            ImmutableSandboxedEnvironment().parse(template)
        )
    except Exception:  # noqa: BLE001 - jinja2's TemplateSyntaxError and friends
        return False


def template_reasons(template: str, think_start: str | None) -> bool:
    """Whether ``template`` writes or switches a thought (its markers or a switch's name)."""
    return bool(template) and (
        (think_start is not None and think_start in template)
        or any(switch in template for switch in THINKING_SWITCHES)
    )


def template_facts(tokenizer) -> TemplateFacts:
    """The facts of an mlx-lm tokenizer wrapper (or anything with its attributes)."""
    template = template_text(tokenizer)
    think_start = getattr(tokenizer, "think_start", None)
    think_end = getattr(tokenizer, "think_end", None)
    reasons = bool(getattr(tokenizer, "has_thinking", False)) and template_reasons(
        template, think_start
    )
    return TemplateFacts(
        template=template,
        takes_tools=reads_variable(template, "tools"),
        think_start=think_start if reasons else None,
        think_end=think_end if reasons else None,
        opens_thinking=reasons and _opens_thinking(tokenizer, think_start),
        stop_words=_stop_words(tokenizer),
        vocab_size=_vocab_size(tokenizer),
    )


def _opens_thinking(tokenizer, think_start: str) -> bool:
    """Whether the generation prompt with thinking on ends in the thought's opening marker
    (DeepSeek-R1's and Qwen3-Thinking's templates write it themselves)."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "."}],
            add_generation_prompt=True,
            tokenize=False,
            enable_thinking=True,
        )
    except Exception as exc:  # noqa: BLE001 - a template that refuses the probe
        log.debug("the thinking probe failed: %s", exc)
        return False
    return isinstance(text, str) and text.rstrip().endswith(think_start)


def _stop_words(tokenizer) -> tuple[str, ...]:
    ids = sorted(getattr(tokenizer, "eos_token_ids", None) or ())
    try:
        words = [tokenizer.convert_ids_to_tokens(i) for i in ids]
    except Exception:  # noqa: BLE001 - a tokenizer without the method
        return ()
    return tuple(dict.fromkeys(w for w in words if isinstance(w, str) and w))


def _vocab_size(tokenizer) -> int:
    try:
        return len(tokenizer)
    except TypeError:
        return 0
