"""Tool calls without a model: markup held back from streamed text, parsing with mlx-lm's
parser, messages as templates see them, the shipped tool template."""

from __future__ import annotations

import json

import pytest
from mlx_lm.tool_parsers import json_tools

from core.engine.constrain import ToolMarkup
from core.engine.tools import ToolCallText, template_message
from core.engine.types import ChatMessage, GenerationRequest, ToolCall
from core.errors import UserError
from core.models.load.chat_template import read_chat_template, shipped_template

MARKUP = ToolMarkup(
    json_tools.tool_call_start, json_tools.tool_call_end, json_tools.parse_tool_call, True
)
TOOLS = (
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

# SmolLM2-135M-Instruct's own template, as its GGUF (the default model) carries it
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def stream(text: str, step: int = 1):
    """Feed ``text`` in pieces of ``step`` characters; everything shown and every call."""
    filt = ToolCallText(MARKUP, TOOLS)
    shown, calls, pieces = "", [], []
    for at in range(0, len(text), step):
        piece, new = filt.feed(text[at : at + step])
        pieces.append(piece)
        shown += piece
        calls += new
    tail, more = filt.finish()
    return shown + tail, calls + more, pieces


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_markup_never_reaches_the_text_and_calls_come_out(step):
    shown, calls, pieces = stream("Let me check. " + CALL + " Done.", step)
    assert shown == "Let me check.  Done."
    assert not any("<" in p for p in pieces)  # not even a partial marker went out
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert calls[0].id.startswith("call_")


def test_two_calls_and_an_unterminated_one():
    shown, calls, _ = stream(CALL + "\n" + CALL.removesuffix("\n</tool_call>"))
    assert shown == "\n" and len(calls) == 2 and calls[0].id != calls[1].id


def test_a_call_cut_short_never_shows_its_markup():
    shown, calls, pieces = stream('Sure. <tool_call>\n{"name": "get_weather", "argu')
    assert shown == "Sure. " and calls == [] and "<" not in "".join(pieces)


def test_text_that_only_looks_like_markup_is_shown():
    assert stream("a < b and <tool is fine <tool_")[0] == "a < b and <tool is fine <tool_"
    broken = "<tool_call>\nnot json\n</tool_call>"
    shown, calls, _ = stream("x " + broken)
    assert shown == "x " + broken and calls == []  # nothing lost


def test_messages_as_templates_see_them():
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    assert template_message(ChatMessage("assistant", "", (call,))) == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    }
    assert template_message(
        ChatMessage("tool", "18C", tool_call_id="call_1", name="get_weather")
    ) == {"role": "tool", "content": "18C", "tool_call_id": "call_1", "name": "get_weather"}


def test_request_tool_choice_is_checked():
    with pytest.raises(ValueError):
        GenerationRequest(tool_choice="sometimes")
    with pytest.raises(ValueError):
        GenerationRequest(tool_choice="function")  # which function?


def _render(template: str, messages, tools=None) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        [messages], chat_template=template, tools=tools, add_generation_prompt=True
    )
    return rendered[0]


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "again"},
        ],
    ],
)
def test_the_shipped_tool_template_renders_plain_chats_like_smollm2s_own(messages):
    assert _render(shipped_template("smollm2_tools.jinja"), messages) == _render(
        SMOLLM2_TEMPLATE, messages
    )


def test_the_shipped_tool_template_renders_tools_calls_and_results():
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    messages = [
        template_message(m)
        for m in (
            ChatMessage("user", "Weather in Paris?"),
            ChatMessage("assistant", "", (call,)),
            ChatMessage("tool", "18C", tool_call_id="call_1", name="get_weather"),
        )
    ]
    text = _render(shipped_template("smollm2_tools.jinja"), messages, list(TOOLS))
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert "<|im_start|>assistant\n" + CALL + "<|im_end|>" in text
    assert (
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        in text
    )


def test_read_chat_template(tmp_path):
    good = tmp_path / "t.jinja"
    good.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert "messages" in read_chat_template(good)
    with pytest.raises(UserError, match="cannot read"):
        read_chat_template(tmp_path / "missing.jinja")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    with pytest.raises(UserError, match="not a valid Jinja"):
        read_chat_template(bad)


def test_a_call_cut_by_max_tokens_is_kept_for_its_error():
    """A reply cut inside a call, under ``auto`` too: the call so far is kept (never shown
    as text) and the request's error carries it (core/engine/replies.py, issue 43.3)."""
    import dataclasses
    from types import SimpleNamespace

    from core.engine.replies import cut_call

    text = ToolCallText(MARKUP, TOOLS)
    cut = '{"name": "get_weather", "arguments": {"city": "Pa'
    shown, calls = text.feed("Let me check. <tool_call>\n" + cut)
    assert (shown, calls) == ("Let me check. ", []) and text.finish() == ("", [])
    assert text.unfinished == cut

    def state(tool_text, choice="auto", shown_text=shown):
        ask = GenerationRequest(messages=(ChatMessage("user", "hi"),), tools=TOOLS)
        request = dataclasses.replace(ask, tool_choice=choice)
        return SimpleNamespace(
            handle=SimpleNamespace(request=request),
            tool_text=tool_text,
            shown=[shown_text],
            generated=[0] * 12,
        )

    message = cut_call(state(text), "length")
    assert message.startswith("the tool call was cut by max_tokens (12 tokens)") and cut in message
    assert cut_call(state(text), "stop") is None
    plain = ToolCallText(MARKUP, TOOLS)
    plain.feed("Just words.")
    plain.finish()
    assert cut_call(state(plain, shown_text="Just words."), "length") is None  # no call begun
    forced = ToolCallText(MARKUP, TOOLS)
    forced.feed("<tool_")  # forced, cut before the marker was whole
    forced.finish()
    assert "(nothing yet)" in cut_call(state(forced, "required", ""), "length")
