"""What a loaded model's chat template and tokenizer say about the model, as plain values: the
template's text, whether it takes tools, whether the model reasons (and its thinking
markers), the text of its end-of-turn tokens. Front ends that describe a model read them
(Ollama's ``/api/show``: template, capabilities, stop parameters; a request that asks a
model that does not reason to think). Worked out once per load, off the engine thread (the
tokenizer is not MLX).
"""

from __future__ import annotations

from dataclasses import dataclass

# what a template that writes or switches a thought names (Qwen 3, DeepSeek, gpt-oss...)
THINKING_WORDS = ("<think>", "enable_thinking", "reasoning_content", "reasoning_effort")


@dataclass(frozen=True)
class TemplateFacts:
    """A loaded model's chat template and tokenizer, described."""

    template: str = ""  # the chat template's Jinja text ("" without one)
    takes_tools: bool = False  # the template reads ``tools``
    # the markers around a reasoning model's thinking (None: the model does not reason;
    # core.engine.reasoning finds them, as the engine does to split the thinking out)
    think_start: str | None = None
    think_end: str | None = None
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
        parsed = ImmutableSandboxedEnvironment().parse(template)
        return name in meta.find_undeclared_variables(parsed)
    except Exception:  # noqa: BLE001 - jinja2's TemplateSyntaxError and friends
        return False


def template_reasons(template: str) -> bool:
    """Whether a chat template (of a model not loaded) writes or switches a thought."""
    return any(word in template for word in THINKING_WORDS)


def template_facts(tokenizer) -> TemplateFacts:
    """The facts of an mlx-lm tokenizer wrapper (or anything with its attributes)."""
    from core.engine.reasoning import thinking_markup  # imports mlx-lm's text state machine

    template = template_text(tokenizer)
    markup = thinking_markup(tokenizer)
    return TemplateFacts(
        template=template,
        takes_tools=reads_variable(template, "tools"),
        think_start=markup.start if markup is not None else None,
        think_end=markup.end if markup is not None else None,
        stop_words=_stop_words(tokenizer),
        vocab_size=_vocab_size(tokenizer),
    )


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
