"""Reasoning models (core/engine/reasoning.py and the reply path): the thinking markers found
from the tokenizer and the template, a reply split into thinking and answer as it streams
(markers held back, never shown; layout whitespace dropped), a reply that starts inside its
thinking, thinking tokens counted, tool calls parsed out of the answer only, and the
engine's events for the scripted reasoning model (its thinking never in a TokenEvent, the
template's switches reaching it)."""

from __future__ import annotations

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tool_parsers import json_tools
from transformers import PreTrainedTokenizerFast

from core.engine.constrain import ToolMarkup
from core.engine.engine import RequestHandle
from core.engine.generation import StopText
from core.engine.reasoning import (
    ReasoningText,
    ThinkingMarkup,
    opens_thinking,
    thinking_markup,
)
from core.engine.replies import Finisher
from core.engine.running import Active
from core.engine.tools import ToolCallText, template_message
from core.engine.types import (
    ChatMessage,
    DoneEvent,
    GenerationRequest,
    ReasoningEvent,
    SamplingParams,
    TokenEvent,
    ToolCallEvent,
)
from core.models.tiny_model import CHAT_TEMPLATE, build_tokenizer
from tests.core.engine.helpers import start_engine
from tests.core.engine.thinking_model import (
    ANSWER,
    OPENING_TEMPLATE,
    REPLY_TOKENS,
    THINKING,
    THINKING_TOKENS,
    write_thinking_model,
)

THINK = ThinkingMarkup("<think>", "</think>", (259,), (260,))
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = (
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
)


def split(text: str, step: int = 1, inside: bool = False) -> tuple[str, str, list[str]]:
    """``text`` fed ``step`` characters at a time: all the thinking, all the answer, and the
    pieces of thinking as they were sent."""
    reasoning = ReasoningText(THINK, inside)
    thinking, answer, pieces = "", "", []
    for at in range(0, len(text), step):
        more, shown = reasoning.feed(text[at : at + step])
        thinking, answer = thinking + more, answer + shown
        pieces += [more] if more else []
    more, shown = reasoning.finish()
    return thinking + more, answer + shown, pieces


@pytest.mark.parametrize("step", [1, 2, 5, 100])
def test_a_reply_splits_into_thinking_and_answer(step):
    thinking, answer, _ = split("<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.", step)
    assert (thinking, answer) == ("Let me see: 2+2.", "It is 4.")


def test_markers_are_held_back_until_they_can_no_longer_match():
    reasoning = ReasoningText(THINK)
    assert reasoning.feed("<thi") == ("", "")  # could still be <think>
    assert reasoning.feed("nk>why") == ("why", "")
    assert reasoning.feed("</th") == ("", "")
    assert reasoning.feed("ought> no") == (
        "</thought> no",
        "",
    )  # not the end marker: thinking text
    assert reasoning.feed("</think>yes") == ("", "yes")


def test_a_reply_without_thinking_is_left_exactly_as_it_is():
    assert split("\n\n  Plain answer.\n\n", 3) == ("", "\n\n  Plain answer.\n\n", [])


def test_inner_whitespace_of_the_thinking_is_kept_and_its_ends_dropped():
    thinking, answer, pieces = split("<think>\n a\n\nb \n</think>\n\nc", 1)
    assert thinking == "a\n\nb" and answer == "c"
    # no layout sent early: whitespace goes out only with the text after it
    assert pieces[0] == "a" and not any(piece[-1].isspace() for piece in pieces)


def test_a_reply_that_starts_inside_its_thinking():
    assert split("\nstill thinking\n</think>\n\nAnswer.", 4, inside=True)[:2] == (
        "still thinking",
        "Answer.",
    )


def test_thinking_cut_short_stays_thinking_and_a_cut_marker_is_text():
    assert split("<think>half a thought", 3)[:2] == ("half a thought", "")
    assert split("answer <thi", 2)[:2] == ("", "answer <thi")


def test_thinking_tokens_are_counted_by_id_markers_included():
    reasoning = ReasoningText(THINK)
    for token in [259, 1, 2, 3, 260, 4, 5]:
        reasoning.count(token)
    assert reasoning.tokens == 5
    inside = ReasoningText(THINK, inside=True)
    for token in [1, 2, 260, 4]:
        inside.count(token)
    assert inside.tokens == 3
    words = ThinkingMarkup("<think>", "</think>", (60, 116), (60, 47))  # several tokens each
    counted = ReasoningText(words)
    for token in [9, 60, 116, 7, 60, 47, 8]:
        counted.count(token)
    assert counted.tokens == 5


def test_a_reply_opens_thinking_when_its_prompt_ends_inside_it():
    assert opens_thinking(THINK, [5, 6, 259, 10])
    assert not opens_thinking(THINK, [5, 259, 7, 260, 10])
    assert not opens_thinking(THINK, [5, 6, 7])
    # only the prompt's last tokens count: a <think> long before is history
    assert not opens_thinking(THINK, [259] + [7] * 200)


def wrapper(template: str, added: tuple[str, ...] = ()) -> TokenizerWrapper:
    hf = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(added))
    hf.chat_template = template
    return TokenizerWrapper(hf)


def test_markers_come_from_mlx_lm_then_the_vocabulary_then_the_template():
    # <think> as a token: mlx-lm's own inference (has_thinking)
    found = thinking_markup(wrapper(CHAT_TEMPLATE, ("<think>", "</think>")))
    assert found == ThinkingMarkup("<think>", "</think>", (259,), (260,))
    # Magistral's [THINK] tokens, which mlx-lm does not know: taken where the template writes them
    magistral = CHAT_TEMPLATE + "{# [THINK] ... [/THINK] #}"
    assert thinking_markup(wrapper(magistral, ("[THINK]", "[/THINK]"))) == ThinkingMarkup(
        "[THINK]", "[/THINK]", (259,), (260,)
    )
    assert thinking_markup(wrapper(CHAT_TEMPLATE, ("[THINK]", "[/THINK]"))) is None
    # <think> written by the template as text: markers of several tokens
    texts = thinking_markup(wrapper(CHAT_TEMPLATE + "{# <think> </think> #}"))
    assert texts.start == "<think>" and texts.start_ids == tuple(b"<think>")
    assert thinking_markup(wrapper(CHAT_TEMPLATE)) is None


def active(reasoning: ReasoningText, tools: bool = True) -> Active:
    markup = ToolMarkup(
        json_tools.tool_call_start, json_tools.tool_call_end, json_tools.parse_tool_call, True
    )
    handle = RequestHandle(GenerationRequest(messages=(ChatMessage("user", "hi"),)))
    return Active(
        handle=handle,
        prompt=[1],
        started=0.0,
        max_tokens=100,
        stop_text=StopText(()),
        detok=None,
        tool_text=ToolCallText(markup, TOOLS) if tools else None,
        reasoning=reasoning,
    )


def test_tool_calls_are_parsed_out_of_the_answer_never_out_of_the_thinking():
    state = active(ReasoningText(THINK))
    reply = f"<think>Maybe {CALL} is wrong.</think>Sure. {CALL}"
    for char in reply:
        Finisher(set(), None).show(state, char)
    Finisher(set(), None).show(state, "", final=True)
    state.handle.finish()
    events = list(state.handle.events(timeout=0))
    thinking = "".join(e.text for e in events if isinstance(e, ReasoningEvent))
    answer = "".join(e.text for e in events if isinstance(e, TokenEvent))
    calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
    assert thinking == f"Maybe {CALL} is wrong." and answer == "Sure. "
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris"}')]


def test_an_assistant_messages_thinking_reaches_the_template():
    message = ChatMessage("assistant", "4", reasoning="2+2")
    assert template_message(message) == {
        "role": "assistant",
        "content": "4",
        "reasoning_content": "2+2",
    }
    assert "reasoning_content" not in template_message(ChatMessage("assistant", "4"))


# ---------------------------------------------------------------- the scripted model
@pytest.fixture(scope="module")
def thinking_engines(tmp_path_factory):
    """Engines on the scripted reasoning model: Qwen3's template, and one whose generation
    prompt opens the thinking."""
    root = tmp_path_factory.mktemp("thinking")
    qwen3 = write_thinking_model(root / "qwen3")
    opening = write_thinking_model(root / "opening", OPENING_TEMPLATE)
    engines = {
        "qwen3": start_engine(root / "d1", qwen3, disk_cache=False),
        "opening": start_engine(root / "d2", opening, disk_cache=False),
    }
    yield engines
    for engine in engines.values():
        engine.shutdown()


def ask(engine, temperature: float = 0.0, **request) -> list:
    return list(
        engine.stream(
            GenerationRequest(
                messages=(ChatMessage("user", "Is it OK?"),),
                sampling=SamplingParams(temperature=temperature, max_tokens=20),
                use_cache=False,
                **request,
            )
        )
    )


@pytest.mark.parametrize("template", ["qwen3", "opening"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_engine_sends_thinking_and_answer_apart(thinking_engines, template, temperature):
    events = ask(thinking_engines[template], temperature)
    done = events[-1]
    assert isinstance(done, DoneEvent)
    thinking = "".join(e.text for e in events if isinstance(e, ReasoningEvent))
    answer = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert (thinking, answer) == (done.reasoning, done.text) == (THINKING, ANSWER)
    reply = REPLY_TOKENS - (1 if template == "opening" else 0)  # its <think> is the prompt's
    assert done.stats.completion_tokens == reply
    assert done.stats.reasoning_tokens == THINKING_TOKENS - (template == "opening")


def test_a_text_completion_is_never_split(thinking_engines):
    engine = thinking_engines["qwen3"]
    request = GenerationRequest(
        prompt_text="<|im_start|>user\nIs it OK?<|im_end|>\n<|im_start|>assistant\n",
        sampling=SamplingParams(temperature=0.0, max_tokens=20),
        use_cache=False,
    )
    events = list(engine.stream(request))
    assert not any(isinstance(e, ReasoningEvent) for e in events)
    assert events[-1].text == f"<think>{THINKING}</think>{ANSWER}" and not events[-1].reasoning


def test_template_switches_reach_the_template(thinking_engines):
    engine = thinking_engines["qwen3"]
    plain = ask(engine)[-1].stats.prompt_tokens
    off = ask(engine, template_kwargs={"enable_thinking": False})[-1].stats.prompt_tokens
    assert off - plain == 6  # <think> \n \n </think> \n \n: Qwen3's empty thinking
