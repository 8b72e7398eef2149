"""A reply's tool steps (core.chats.tool_steps): checked into one shape, read back from JSON,
and asked of the engine as calls and results, each step's prompt a prefix of the next's."""

from __future__ import annotations

import base64
import json

import pytest

from core.chats import tool_steps
from core.chats.store import ChatStore
from core.chats.tool_steps import CANCELLED, DENIED, FAILED, StepError
from core.chats.turn import ChatTurn
from core.engine.prompt import render_prompt
from core.engine.types import ChatMessage, GenerationRequest, ToolCall

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(92)).decode()  # 100 bytes
TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files of a folder.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
)


def call(id_: str, name: str = "list_files", arguments: str = '{"path": "/tmp"}') -> dict:
    return {"id": id_, "name": name, "arguments": arguments, "server": "files", "tool": name}


def text_result(id_: str, text: str, status: str = "ok") -> dict:
    return {"id": id_, "status": status, "parts": [{"type": "text", "text": text}]}


STEPS = (
    {
        "content": "Let me look.",
        "tool_calls": [call("c1")],
        "results": [text_result("c1", "a.txt\nb.txt")],
        "stats": {"prompt_tokens": 40, "cached_tokens": 0},
    },
    {
        "content": "",
        "reasoning": "Two more to check.",
        "tool_calls": [call("c2", "read", '{"path": "a.txt"}'), call("c3", "shot", "{}")],
        "results": [
            {
                "id": "c3",
                "status": "ok",
                "parts": [{"type": "image", "mime": "image/png", "data": PNG}],
            },
            text_result("c2", "hello"),
        ],
    },
)


def test_checked_steps_keep_one_shape_and_drop_unknown_keys():
    step = {
        **STEPS[0],
        "tool_calls": [{**call("c1"), "env": {"TOKEN": "secret"}}],
        "server_config": {"command": "npx", "headers": {"Authorization": "Bearer x"}},
    }
    (out,) = tool_steps.checked([step])
    assert out == STEPS[0]  # nothing of a server's configuration is kept
    assert "secret" not in json.dumps(out) and "Bearer" not in json.dumps(out)
    minimal = tool_steps.checked([{"tool_calls": [{"id": "x", "name": "n", "arguments": ""}]}])
    assert minimal == (
        {
            "content": "",
            "tool_calls": [{"id": "x", "name": "n", "arguments": "", "server": None, "tool": None}],
            "results": [],
        },
    )
    assert tool_steps.checked(None) == () == tool_steps.checked([])
    assert tool_steps.from_json(tool_steps.to_json(STEPS)) == STEPS
    assert tool_steps.to_json(()) is None and tool_steps.from_json(None) == ()


@pytest.mark.parametrize(
    ("steps", "says"),
    [
        ("not a list", "not a list of steps"),
        ({"content": ""}, "not a list of steps"),
        ([7], "tool step 1 is not an object"),
        ([{"tool_calls": []}], "tool step 1: its tool_calls are not a list of calls"),
        ([{"content": 3, "tool_calls": [call("a")]}], "its content is not text"),
        ([{"tool_calls": [{"id": "a", "name": "", "arguments": "{}"}]}], "call 1: its name"),
        ([{"tool_calls": [{"id": "a", "name": "n", "arguments": {}}]}], "its arguments"),
        ([{"tool_calls": [call("a"), call("a")]}], "two of its calls have the same id"),
        ([{"tool_calls": [call("a")], "results": [text_result("b", "x")]}], "answers no call"),
        ([{"tool_calls": [call("a")], "results": [text_result("a", "x", "fine")]}], "status"),
        (
            [{"tool_calls": [call("a")], "results": [text_result("a", "x")] * 2}],
            "two results answer the same call",
        ),
        (
            [
                STEPS[0],
                {
                    "tool_calls": [call("a")],
                    "results": [{"id": "a", "status": "ok", "parts": [{"type": "audio"}]}],
                },
            ],
            "tool step 2, result 1, part 1 is neither a text nor an image",
        ),
        (
            [
                {
                    "tool_calls": [call("a")],
                    "results": [
                        {
                            "id": "a",
                            "status": "ok",
                            "parts": [{"type": "image", "mime": "image/png", "data": "no!"}],
                        }
                    ],
                }
            ],
            "not base64",
        ),
        ([{"tool_calls": [call("a")], "stats": [1]}], "its stats are not an object"),
    ],
)
def test_steps_that_are_not_steps_are_one_line(steps, says):
    with pytest.raises(StepError, match=says) as raised:
        tool_steps.checked(steps)
    assert "\n" not in str(raised.value)


def test_stored_text_that_is_not_steps_is_a_step_error():
    for text in ("{", '{"content": ""}', '[{"tool_calls": 1}]'):
        with pytest.raises(StepError):
            tool_steps.from_json(text)


def test_results_as_the_model_reads_them():
    assert tool_steps.result_text(text_result("a", "42")) == "42"
    assert tool_steps.result_text(tool_steps.checked(STEPS)[1]["results"][0]) == (
        "[image: image/png, 100 bytes]"
    )
    two = {"id": "a", "status": "ok", "parts": [{"type": "text", "text": "x"}] * 2}
    assert tool_steps.result_text(two) == "x\nx"
    assert tool_steps.result_text({"id": "a", "status": "denied", "parts": []}) == DENIED
    assert tool_steps.result_text(text_result("a", "ENOENT: no file", "error")) == "ENOENT: no file"
    assert tool_steps.result_text({"id": "a", "status": "error", "parts": []}) == FAILED
    assert tool_steps.result_text({"id": "a", "status": "cancelled", "parts": []}) == CANCELLED
    assert tool_steps.result_text(None) == CANCELLED  # a call the loop never ran


def test_a_reply_with_steps_expands_into_calls_results_and_its_answer():
    steps = tool_steps.checked(STEPS)
    assert tool_steps.expand("assistant", "Two files.", "Done.", steps) == (
        ChatMessage(
            "assistant", "Let me look.", (ToolCall("c1", "list_files", '{"path": "/tmp"}'),)
        ),
        ChatMessage("tool", "a.txt\nb.txt", tool_call_id="c1", name="list_files"),
        ChatMessage(
            "assistant",
            "",
            (ToolCall("c2", "read", '{"path": "a.txt"}'), ToolCall("c3", "shot", "{}")),
            reasoning="Two more to check.",
        ),
        # in the order of the calls, not of the results
        ChatMessage("tool", "hello", tool_call_id="c2", name="read"),
        ChatMessage("tool", "[image: image/png, 100 bytes]", tool_call_id="c3", name="shot"),
        ChatMessage("assistant", "Two files.", reasoning="Done."),
    )
    # a loop stopped at its step limit has no answer: its last results end it
    assert tool_steps.expand("assistant", "", None, steps)[-1].role == "tool"
    assert tool_steps.expand("assistant", "hi", None, ()) == (ChatMessage("assistant", "hi"),)
    unanswered = tool_steps.checked([{"tool_calls": [call("z")]}])
    assert tool_steps.step_messages(unanswered[0])[1].content == CANCELLED


@pytest.fixture
def store(tmp_path):
    with ChatStore(tmp_path / "chats.db") as store:
        yield store


def test_a_turn_asks_the_stored_tool_loop_again_and_builds_each_steps_prompt(store):
    chat = store.create_session("tools", system_prompt="Use tools.")
    store.add_turn(chat.id, "Files?", "Two files.", {"prompt_tokens": 9}, tool_steps=STEPS[:1])
    turn = ChatTurn.start(store, store.get_session_by_id(chat.id), "And in a.txt?")
    assert [m.role for m in turn.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert turn.messages[2].tool_calls[0].id == "c1" and turn.messages[3].content == "a.txt\nb.txt"
    # each step's figures count as a turn of their own, before the reply's
    assert turn.kept_stats == [{"prompt_tokens": 40, "cached_tokens": 0}, {"prompt_tokens": 9}]
    assert turn.loop_messages() == turn.messages
    running = turn.loop_messages(STEPS[1:])
    assert running[: len(turn.messages)] == turn.messages and running[-1].role == "tool"
    request = turn.request(
        GenerationRequest().sampling,
        tool_steps=STEPS[1:],
        tools=TOOLS,
        tool_choice="function",
        tool_name="list_files",
    )
    assert request.messages == running and request.tools == TOOLS
    assert (request.tool_choice, request.tool_name) == ("function", "list_files")
    with pytest.raises(StepError):
        turn.loop_messages([{"tool_calls": "nope"}])


# -- each step's prompt is the previous one's plus its calls and results --


def _step_prompts(render, history: tuple[ChatMessage, ...], steps) -> list:
    """The prompt of each step of a loop over ``steps`` (before step 1, after step 1, ...),
    then the next turn's, after the stored reply."""
    prompts = [render(tool_steps.loop_messages(history, steps[:k])) for k in range(len(steps) + 1)]
    stored = tool_steps.expand("assistant", "There are two files.", None, steps)
    prompts.append(render((*history, *stored, ChatMessage("user", "Thanks!"))))
    return prompts


HISTORY = (
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "hi"),
    ChatMessage("assistant", "Hello."),
    ChatMessage("user", "How many files are in /tmp?"),
)
LOOP = tool_steps.checked(
    [
        *STEPS,
        {
            "content": "One more.",
            "tool_calls": [call("c4")],
            "results": [{"id": "c4", "status": "denied", "parts": []}],
        },
    ]
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model, tmp_path_factory):
    from core.models.load.loader import load_model

    return load_model(str(tiny_model), tmp_path_factory.mktemp("data")).tokenizer


@pytest.mark.parametrize("tools", [(), TOOLS], ids=["no-tools", "generic-tools"])
def test_each_steps_prompt_extends_the_last_on_the_tiny_chatml_model(tokenizer, tools):
    """The tiny model's ChatML template (with tools: the generic tool format, results as user
    turns): as text and as token ids, step k's prompt is a prefix of step k+1's, and the
    next turn's prompt extends the last step's."""

    def render(messages):
        request = GenerationRequest(messages=messages, tools=tools)
        return render_prompt(tokenizer, request)

    prompts = _step_prompts(render, HISTORY, LOOP)
    texts = [tokenizer.decode(ids) for ids in prompts]
    for k in range(len(prompts) - 1):
        assert prompts[k + 1][: len(prompts[k])] == prompts[k], f"step {k}"
        assert texts[k + 1].startswith(texts[k]) and len(texts[k + 1]) > len(texts[k])
    if tools:  # the calls and results are in the prompt, as the generic format writes them
        assert '<tool_call>\n{"name":"list_files","arguments":{"path":"/tmp"}}' in texts[1]
        assert '<tool_result name="list_files" id="c4">\n' + DENIED in texts[3]


def test_each_steps_prompt_extends_the_last_in_a_template_with_tool_markup():
    """The shipped tool template (SmolLM2's with Hermes-style tool markup) sees the calls and
    results themselves: the prefix holds there too."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from core.engine.tools import template_message
    from core.models.load.chat_template import shipped_template

    template = shipped_template("smollm2_tools.jinja")

    def render(messages):
        chat = [template_message(m) for m in messages]
        rendered, _ = render_jinja_template(
            [chat], chat_template=template, tools=list(TOOLS), add_generation_prompt=True
        )
        return rendered[0]

    texts = _step_prompts(render, HISTORY, LOOP)
    for k in range(len(texts) - 1):
        assert texts[k + 1].startswith(texts[k]) and len(texts[k + 1]) > len(texts[k]), k
    assert "a.txt\nb.txt" in texts[1] and DENIED in texts[3]
