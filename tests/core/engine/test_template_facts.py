"""What a loaded model's chat template and tokenizer say about it (core/engine/template_facts.py):
the template's text, whether it takes tools, whether and how the model reasons, its stop
words; from a real tiny model's tokenizer and from stand-ins for a reasoning model's."""

from __future__ import annotations

from core.engine.template_facts import TemplateFacts, reads_variable, template_facts
from core.models.load.chat_template import shipped_template
from core.models.load.loader import load_model
from core.models.tiny_model import CHAT_TEMPLATE


class ReasoningTokenizer:
    """A stand-in for a reasoning model's tokenizer wrapper (Qwen 3's markers)."""

    has_thinking = True
    think_start, think_end = "<think>", "</think>"
    eos_token_ids = {2}

    def __init__(self, template: str, opens: bool):
        self.chat_template = template
        self.opens = opens

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, enable_thinking):
        return "assistant\n" + ("<think>\n" if self.opens and enable_thinking else "")

    def convert_ids_to_tokens(self, i: int) -> str:
        return "<|im_end|>"

    def __len__(self) -> int:
        return 151_000


def test_the_tiny_models_facts(tiny_model, tmp_path):
    facts = template_facts(load_model(str(tiny_model), tmp_path).tokenizer)
    assert facts.template == CHAT_TEMPLATE and not facts.takes_tools and not facts.reasons
    assert set(facts.stop_words) == {"<|im_end|>", "<|endoftext|>"}
    assert facts.vocab_size == 259
    tools = load_model(
        str(tiny_model), tmp_path, chat_template=shipped_template("smollm2_tools.jinja")
    ).tokenizer
    assert template_facts(tools).takes_tools


def test_a_reasoning_model_and_one_whose_prompt_opens_the_thought():
    qwen3 = "{% if enable_thinking is defined %}{% endif %}<think>{{ messages }}"
    facts = template_facts(ReasoningTokenizer(qwen3, opens=False))
    assert facts.reasons and (facts.think_start, facts.think_end) == ("<think>", "</think>")
    assert not facts.opens_thinking and facts.stop_words == ("<|im_end|>",)
    assert template_facts(ReasoningTokenizer(qwen3, opens=True)).opens_thinking
    # markers in the vocabulary, but a template that never thinks: not a reasoning model
    assert not template_facts(ReasoningTokenizer("{{ messages }}", opens=False)).reasons
    assert not TemplateFacts().reasons


def test_reads_variable_parses_the_template():
    assert reads_variable("{% if tools %}{{ tools | tojson }}{% endif %}", "tools")
    assert not reads_variable("{% set tools = [] %}{{ tools }}", "tools")  # its own variable
    assert not reads_variable("{% broken", "tools") and not reads_variable("", "tools")
