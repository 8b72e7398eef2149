"""``radixchat chat`` on a reasoning model: the reply alone on stdout, the thinking apart on
stderr (dim on a terminal, marked elsewhere), both in --json and in the chat's history."""

from __future__ import annotations

import io
import json

import pytest

from core import paths
from core.chats.store import ChatStore
from core.cli.chat import DIM, NORMAL, Thoughts
from core.cli.main import main
from tests.core.engine.thinking_model import ANSWER, THINKING, THINKING_TOKENS, write_thinking_model


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory):
    return write_thinking_model(tmp_path_factory.mktemp("thinking") / "qwen3")


def chat(model, data, *extra) -> int:
    return main(
        ["chat", "--model", str(model), "--data-dir", str(data), "--kv-tokens", "4096", *extra]
    )


def test_the_thinking_is_printed_apart_from_the_reply(capsys, thinking_model, tmp_path):
    assert chat(thinking_model, tmp_path, "--session", "t", "Is it OK?") == 0
    captured = capsys.readouterr()
    assert captured.out == ANSWER + "\n"  # the reply alone: `> answer.txt` keeps it clean
    assert f"[thinking]\n{THINKING}\n[/thinking]\n" in captured.err
    with ChatStore(paths.chats_db_path(tmp_path)) as store:
        reply = store.messages(store.get_session("t").id)[-1]
    assert (reply.content, reply.reasoning) == (ANSWER, THINKING)


def test_json_gives_the_thinking_beside_the_reply(capsys, thinking_model, tmp_path):
    assert chat(thinking_model, tmp_path, "--json", "Is it OK?") == 0
    captured = capsys.readouterr()
    turn = json.loads(captured.out.strip().splitlines()[-1])
    assert (turn["reply"], turn["reasoning"]) == (ANSWER, THINKING)
    assert turn["reasoning_tokens"] == THINKING_TOKENS and "[thinking]" not in captured.err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_thinking_is_dim():
    terminal = Terminal()
    thoughts = Thoughts(terminal)
    thoughts.piece("Two and ")
    thoughts.piece("two.\x1b[31m")  # the model's text cannot recolour the terminal
    thoughts.close()
    thoughts.close()  # once
    assert terminal.getvalue() == f"{DIM}Two and two.\\x1b[31m{NORMAL}\n"


def test_every_sampling_setting_of_a_chat_has_its_flag():
    """``radixchat chat`` takes the window's sampling keys (core.chats.settings.SAMPLING_KEYS),
    each from its own flag, and records a reply's sampling under the same keys."""
    from core.chats.settings import SAMPLING_KEYS, sampling_settings
    from core.cli.chat import sampling_params
    from core.cli.main import build_parser

    flags = {
        "temperature": ("--temp", 0.5),
        "top_p": ("--top-p", 0.8),
        "top_k": ("--top-k", 5),
        "min_p": ("--min-p", 0.1),
        "repetition_penalty": ("--repetition-penalty", 1.2),
        "max_tokens": ("--max-tokens", 9),
        "seed": ("--seed", 3),
    }
    assert set(flags) == set(SAMPLING_KEYS)
    argv = [part for flag, value in flags.values() for part in (flag, str(value))]
    args = build_parser().parse_args(["chat", "hello", *argv])
    assert sampling_settings(sampling_params(args)) == {
        key: value for key, (_, value) in flags.items()
    }
