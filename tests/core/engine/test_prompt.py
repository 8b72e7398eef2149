"""Prompts as token ids, off the engine thread: rendering (chat template, raw text, token
ids) on a tiny generated model, and the size limit with its character check before
tokenising."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.engine.prompt import PromptLimit, Prompts, render_prompt
from core.engine.types import ChatMessage, GenerationRequest
from core.errors import ContextLengthError, ErrorKind, UserError
from core.models.load.loader import load_model


@pytest.fixture(scope="module")
def loaded(tiny_model, tmp_path_factory):
    return load_model(str(tiny_model), tmp_path_factory.mktemp("data"))


class PlainTokenizer:
    """A tokenizer without a chat template: one id per byte."""

    has_chat_template = False

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())


class CountingTokenizer:
    """The tiny model's tokenizer, counting the characters it was asked to encode."""

    def __init__(self, tokenizer):
        self.inner = tokenizer
        self.encoded: list[int] = []

    def encode(self, text: str, **kw):
        self.encoded.append(len(text))
        return self.inner.encode(text, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def prompts(loaded, max_prompt_tokens: int | None = None) -> tuple[Prompts, CountingTokenizer]:
    tokenizer = CountingTokenizer(loaded.tokenizer)
    limit = PromptLimit(loaded.info.name, loaded.info.context_length, max_prompt_tokens)
    return Prompts(tokenizer, limit), tokenizer


def user(text: str) -> GenerationRequest:
    return GenerationRequest(messages=(ChatMessage("user", text),))


# ---------------------------------------------------------------- render_prompt


def test_prompt_tokens_are_taken_as_given(loaded):
    assert render_prompt(loaded.tokenizer, GenerationRequest(prompt_tokens=(5, 6, 7))) == [5, 6, 7]


def test_prompt_text_is_encoded_without_a_template(loaded):
    tokens = render_prompt(loaded.tokenizer, GenerationRequest(prompt_text="hello"))
    assert tokens == list(loaded.tokenizer.encode("hello"))
    assert loaded.tokenizer.decode(tokens).endswith("hello")


def test_messages_go_through_the_chat_template(loaded):
    messages = (ChatMessage("system", "be brief"), ChatMessage("user", "hi <|im_end|> there"))
    tokens = render_prompt(loaded.tokenizer, GenerationRequest(messages=messages))
    expected = loaded.tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi <|im_end|> there"},
        ],
        add_generation_prompt=True,
    )
    # rendered, then tokenised: what the template's own tokenising gives
    assert tokens == list(expected)
    text = loaded.tokenizer.decode(tokens)
    assert "be brief" in text and text.index("be brief") < text.index("hi")


def test_messages_without_a_template_become_role_lines():
    request = GenerationRequest(
        messages=(ChatMessage("user", "hi"), ChatMessage("assistant", "yo"))
    )
    assert bytes(render_prompt(PlainTokenizer(), request)) == b"user: hi\nassistant: yo\nassistant:"


def test_context_tokens_come_before_the_rendered_prompt(loaded):
    """Ollama's ``context``: an earlier prompt and reply's ids, then this turn's prompt."""
    turn = user("and then?")
    alone = render_prompt(loaded.tokenizer, turn)
    after = render_prompt(loaded.tokenizer, replace(turn, context_tokens=(7, 8, 9)))
    assert after == [7, 8, 9, *alone]
    text = GenerationRequest(prompt_text="x", context_tokens=(5,))
    assert render_prompt(loaded.tokenizer, text)[0] == 5


@pytest.mark.parametrize(
    "request_",
    [GenerationRequest(), GenerationRequest(prompt_text=""), GenerationRequest(prompt_tokens=())],
)
def test_an_empty_request_is_a_user_error(request_):
    with pytest.raises(UserError, match="empty"):
        render_prompt(PlainTokenizer(), request_)


# ---------------------------------------------------------------- the limit


def test_the_limit_is_the_context_less_one_or_the_users_if_smaller():
    assert PromptLimit("m", 512).tokens == 511
    assert PromptLimit("m", 512, max_prompt_tokens=100).tokens == 100
    assert PromptLimit("m", 512, max_prompt_tokens=5000).tokens == 511
    assert "context of 512" in str(PromptLimit("m", 512, 5000).refuse("600 tokens"))
    assert "--max-prompt-tokens" in str(PromptLimit("m", 512, 100).refuse("600 tokens"))


def test_a_prompt_at_the_limit_passes_and_one_past_it_is_refused(loaded):
    checked, _ = prompts(loaded)
    assert len(checked.tokens(GenerationRequest(prompt_text="a" * 511))) == 511
    with pytest.raises(ContextLengthError) as caught:
        checked.tokens(GenerationRequest(prompt_text="a" * 512))
    assert (
        str(caught.value) == f"the prompt is 512 tokens but {loaded.info.name} has a context of 512"
    )
    assert caught.value.kind is ErrorKind.CONTEXT_TOO_LONG
    with pytest.raises(ContextLengthError, match="context of 512"):
        checked.tokens(GenerationRequest(prompt_tokens=tuple(range(100)) * 6))


def test_max_prompt_tokens_is_named_when_it_is_the_limit(loaded):
    checked, _ = prompts(loaded, max_prompt_tokens=20)
    assert len(checked.tokens(GenerationRequest(prompt_text="b" * 20))) == 20
    with pytest.raises(
        ContextLengthError,
        match=r"the prompt is \d+ tokens but prompts are limited to 20 "
        r"tokens \(--max-prompt-tokens\)",
    ):
        checked.tokens(user("c" * 30))


def test_a_text_too_long_to_fit_is_refused_without_being_tokenised(loaded):
    checked, tokenizer = prompts(loaded)
    longest = checked.longest_entry
    assert longest == len("<|endoftext|>")  # the tiny vocabulary: bytes, and three added tokens
    cap = 511 * longest  # characters: no text longer than this has 511 tokens or fewer
    with pytest.raises(ContextLengthError) as caught:
        checked.tokens(GenerationRequest(prompt_text="d" * (cap + 1)))
    assert tokenizer.encoded == []
    assert str(caught.value) == (
        f"the prompt is {cap + 1:,} characters, so at least 512 tokens, but "
        f"{loaded.info.name} has a context of 512"
    )
    with pytest.raises(ContextLengthError, match="characters"):  # the rendered template counts
        checked.tokens(user("e" * cap))
    with pytest.raises(ContextLengthError, match="characters"):
        checked.count(user("f" * 4_000_000))
    assert tokenizer.encoded == []
    # at the cap it is tokenised (and then refused by its count: 1 token a character here)
    with pytest.raises(ContextLengthError, match=f"the prompt is {cap:,} tokens"):
        checked.tokens(GenerationRequest(prompt_text="g" * cap))
    assert tokenizer.encoded == [cap]


def test_the_character_check_never_refuses_a_prompt_that_fits(loaded):
    """Its bound holds on the most characters a token can stand for: every added token."""
    checked, _ = prompts(loaded)
    dense = GenerationRequest(prompt_text="<|endoftext|>" * 511)
    assert len(checked.tokens(dense)) == 511


def test_count_counts_past_the_limit(loaded):
    checked, _ = prompts(loaded, max_prompt_tokens=20)
    request = user("h" * 100)
    assert checked.count(request) == len(render_prompt(loaded.tokenizer, request)) > 100


NO_MLX_SCRIPT = """
import sys
from transformers import AutoTokenizer
from core.engine.prompt import PromptLimit, Prompts
from core.engine.types import ChatMessage, GenerationRequest
from core.errors import ContextLengthError

class Wrapper:  # what mlx-lm's TokenizerWrapper adds (importing mlx_lm imports mlx)
    has_chat_template = True
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

prompts = Prompts(Wrapper(AutoTokenizer.from_pretrained(sys.argv[1])), PromptLimit("tiny", 512))
chat = GenerationRequest(messages=(ChatMessage("system", "be brief"), ChatMessage("user", "hi")))
ids = prompts.tokens(chat)
assert len(ids) == prompts.count(chat)
try:
    prompts.tokens(GenerationRequest(prompt_text="x" * 10**6))
except ContextLengthError:
    pass
print(len(ids), sorted(m for m in sys.modules if m == "mlx" or m.startswith(("mlx.", "mlx_lm"))))
"""


def test_rendering_and_tokenising_never_load_mlx(loaded, tiny_model):
    """The prompt threads never call MLX, which only the engine thread may: rendering a chat
    template, tokenising and the limit's checks run in a process where mlx is never imported."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", NO_MLX_SCRIPT, str(tiny_model)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-800:]
    count, modules = run.stdout.split(maxsplit=1)
    expected = render_prompt(
        loaded.tokenizer,
        GenerationRequest(messages=(ChatMessage("system", "be brief"), ChatMessage("user", "hi"))),
    )
    assert int(count) == len(expected)  # the same prompt the engine would get
    assert modules.strip() == "[]"


@pytest.mark.faults
def test_the_tool_names_are_found_in_one_pass_over_the_prompt():
    """Issue 26.2: the check that the template kept every tool searched the whole prompt once
    per tool (quadratic: 30,000 tools in a 1.5 MB prompt). One pass now, same answers: a
    name anywhere in the text counts, inside longer words and dotted names too."""
    from core.engine.prompt import names_missing

    text = '{"name": "get_weather"} functions.lookup_v2 [search] grep-files:x "a b" tool_9'
    names = [
        "get_weather",
        "lookup_v2",
        "search",
        "grep-files",
        "files",
        "tool_9",
        "tool_1",
        "a b",
        "ookup",
        "weather2",
        "x",
        "a c",
    ]
    assert names_missing(text, names) == ["tool_1", "weather2", "a c"]
    many = [f"tool_{i}" for i in range(30_000)]
    prompt = " ".join(f'{{"name": "{name}"}}' for name in many[::2])
    assert names_missing(prompt, many) == [name for name in many[1::2] if name not in prompt]
