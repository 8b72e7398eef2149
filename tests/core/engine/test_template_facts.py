"""What a loaded model's chat template and tokenizer say about it (core/engine/template_facts.py):
the template's text, whether it takes tools, whether the model reasons and its markers, its
stop words; from the tiny model's tokenizer and the scripted tiny reasoning model's."""

from __future__ import annotations

from core.engine.template_facts import TemplateFacts, reads_variable, template_facts
from core.models.load.chat_template import shipped_template
from core.models.load.loader import load_model
from core.models.tiny_model import CHAT_TEMPLATE
from tests.core.engine.thinking_model import QWEN3_TEMPLATE, write_thinking_model


def test_the_tiny_models_facts(tiny_model, tmp_path):
    facts = template_facts(load_model(str(tiny_model), tmp_path).tokenizer)
    assert facts.template == CHAT_TEMPLATE and not facts.takes_tools and not facts.reasons
    assert set(facts.stop_words) == {"<|im_end|>", "<|endoftext|>"}
    assert facts.vocab_size == 259
    tools = load_model(
        str(tiny_model), tmp_path, chat_template=shipped_template("smollm2_tools.jinja")
    ).tokenizer
    assert template_facts(tools).takes_tools


def test_a_reasoning_models_facts(tmp_path):
    path = write_thinking_model(tmp_path / "thinking")
    facts = template_facts(load_model(str(path), tmp_path / "data").tokenizer)
    assert facts.reasons and (facts.think_start, facts.think_end) == ("<think>", "</think>")
    assert facts.template == QWEN3_TEMPLATE and facts.takes_tools  # Qwen3's takes tools
    assert not TemplateFacts().reasons


def test_reads_variable_parses_the_template():
    assert reads_variable("{% if tools %}{{ tools | tojson }}{% endif %}", "tools")
    assert not reads_variable("{% set tools = [] %}{{ tools }}", "tools")  # its own variable
    assert not reads_variable("{% broken", "tools") and not reads_variable("", "tools")
