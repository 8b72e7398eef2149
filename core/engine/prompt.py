"""A request's prompt as token ids, worked out off the engine thread, and the limit on its size.

Rendering the chat template (tools and ``--chat-template`` included) and tokenising are
CPU work on the tokenizer, which is not MLX: they run on the thread that asks
(``Engine.count_tokens``) or on the engine's small pool of prompt threads
(``Engine.submit``), never on the engine thread, so a huge message costs the streams
being decoded nothing. The engine thread gets the request back carrying its token ids.
Nothing here imports mlx (``tests/core/engine/test_prompt.py`` renders and tokenises
in a process where mlx never loads).

The limit (:class:`PromptLimit`): a prompt has at most the model's context less one token
(room for the first generated one), or ``--max-prompt-tokens`` if that is smaller. Before
anything is tokenised, a cheap check on the prompt's text: no token stands for more
characters of text than its vocabulary entry has (byte-level vocabularies spell a token
with one character per byte, SentencePiece ones with one per character, ``▁`` for a
space; added tokens are spelled as they are), so a text longer than ``limit × longest
entry`` characters has more tokens than the limit and is refused without being
tokenised. SmolLM2's longest entry is 81 characters: with its 8,192-token context,
a prompt of over 663,471 characters is refused at once (tokenising a message of megabytes
takes seconds: docs/benchmarks.md).
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass

from jinja2 import TemplateError

from core.engine import generic_tools
from core.engine.constrain import tool_name
from core.engine.template_facts import TemplateFacts, template_facts
from core.engine.tools import template_message
from core.engine.types import GenerationRequest
from core.errors import ContextLengthError, UserError


def render_prompt(tokenizer, request: GenerationRequest) -> list[int]:
    """Token ids of the request's prompt (never empty), without a size limit."""
    return _tokens(tokenizer, request, None)


@dataclass(frozen=True)
class PromptLimit:
    """How long a prompt may be, in tokens, for one loaded model."""

    model_name: str
    context_length: int
    max_prompt_tokens: int | None = None  # the user's limit (``--max-prompt-tokens``)

    @property
    def tokens(self) -> int:
        room = self.context_length - 1  # the first generated token needs a place
        return room if self.max_prompt_tokens is None else min(room, self.max_prompt_tokens)

    def refuse(self, size: str) -> ContextLengthError:
        """The error for a prompt of ``size`` ("1,234 tokens") past the limit."""
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < self.context_length - 1:
            return ContextLengthError(
                f"the prompt is {size} but prompts are limited to "
                f"{self.tokens:,} tokens (--max-prompt-tokens)"
            )
        return ContextLengthError(
            f"the prompt is {size} but {self.model_name} has a context of {self.context_length}"
        )


class Prompts:
    """Renders and tokenises requests for one loaded model, within its :class:`PromptLimit`.
    Safe to use from several threads at once (the tokenizer's encode only reads)."""

    def __init__(self, tokenizer, limit: PromptLimit, load: int = 0):
        self.tokenizer = tokenizer
        self.limit = limit
        self.load = load  # which model load this is (the engine counts them)
        self._longest: int | None = None
        self._facts: TemplateFacts | None = None
        self._vocabulary_size: int | None = None
        self._lock = threading.Lock()

    def tokens(self, request: GenerationRequest) -> list[int]:
        """The prompt's token ids; ContextLengthError past the limit, UserError if empty."""
        ids = _tokens(self.tokenizer, request, self._check_text)
        if len(ids) > self.limit.tokens:
            raise self.limit.refuse(f"{len(ids):,} tokens")
        return ids

    def count(self, request: GenerationRequest) -> int:
        """How many tokens the prompt is. Only a text too long to fit by the character
        check is refused (it is not tokenised): a count past the limit is still a count."""
        return len(_tokens(self.tokenizer, request, self._check_text))

    @property
    def longest_entry(self) -> int:
        """Characters in the tokenizer's longest vocabulary entry (worked out once)."""
        self._read_vocabulary()
        return self._longest

    @property
    def vocabulary_size(self) -> int:
        """One more than the tokenizer's largest token id, added tokens included (worked
        out once): token ids a client sends must be below it."""
        self._read_vocabulary()
        return self._vocabulary_size

    def _read_vocabulary(self) -> None:
        with self._lock:
            if self._longest is None:
                vocabulary = self.tokenizer.get_vocab()
                self._longest = max(map(len, vocabulary), default=1)
                self._vocabulary_size = max(vocabulary.values(), default=-1) + 1

    @property
    def facts(self) -> TemplateFacts:
        """The model's chat template and tokenizer, described (worked out once)."""
        with self._lock:
            if self._facts is None:
                self._facts = template_facts(self.tokenizer)
            return self._facts

    def _check_text(self, text: str) -> None:
        longest = self.longest_entry
        if len(text) > self.limit.tokens * longest:
            at_least = math.ceil(len(text) / longest)
            raise self.limit.refuse(f"{len(text):,} characters, so at least {at_least:,} tokens,")


def _tokens(tokenizer, request: GenerationRequest, check_text) -> list[int]:
    if request.prompt_tokens is not None:
        ids = list(request.prompt_tokens)
    else:
        text, special = _text(tokenizer, request)
        if check_text is not None:
            check_text(text)
        ids = list(tokenizer.encode(text, add_special_tokens=special))
    if request.context_tokens:
        ids = [*request.context_tokens, *ids]
    if not ids:
        raise UserError("empty prompt: nothing to generate from")
    return ids


def _text(tokenizer, request: GenerationRequest) -> tuple[str, bool]:
    """The prompt as text, and whether the tokenizer adds its own special tokens (BOS) to
    it: a chat template writes its own."""
    if request.prompt_text is not None:
        return request.prompt_text, True
    if not request.messages:
        raise UserError("empty request: no messages and no prompt")
    tools = list(request.tools) if request.tools and request.tool_choice != "none" else None
    extra = request.template_kwargs
    try:
        if tools and generic_tools.applies(tokenizer):
            return generic_tools.render(tokenizer, request.messages, tools, extra), False
        messages = [template_message(m) for m in request.messages]
        if tools:
            return _text_with_tools(tokenizer, messages, tools, extra), False
        if getattr(tokenizer, "has_chat_template", False):
            return tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **extra
            ), False
    except TemplateError as exc:
        raise UserError(f"the model's chat template refused this request: {exc}") from None
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:", True


def _text_with_tools(tokenizer, messages: list[dict], tools: list[dict], extra: dict) -> str:
    """The prompt with ``tools`` handed to the chat template (one with tool markup; the
    others get the generic format, :mod:`core.engine.generic_tools`). A template that drops
    the tools cannot serve them: a clear error, not a model that never hears of its tools."""
    fix = "start RadixChat with --chat-template FILE (a Jinja template that takes tools)"
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False, **extra
    )
    missing = names_missing(text, [tool_name(t) for t in tools])
    if missing:
        raise UserError(f"this model's chat template drops the tools ({', '.join(missing)}): {fix}")
    return text


_NAME_RUN = re.compile(r"[A-Za-z0-9_.:-]+")  # the characters of a tool name (both APIs' patterns)
_END = ""  # a trie node's key for "a name ends here" (no name character is empty)


def names_missing(text: str, names: list[str]) -> list[str]:
    """The ``names`` that do not occur in ``text``, in one pass over it, however many names
    there are (a search per name was quadratic: 30,000 tools in a 1.5 MB prompt).

    A name made of name characters (``[A-Za-z0-9_.:-]``, which both APIs require) can
    only occur inside a run of such characters; each distinct run is walked once from each
    of its positions down a trie of the names, never deeper than the longest name. Any
    other name (the engine's own callers may send one) is searched for as it is."""
    found: set[str] = set()
    trie: dict = {}
    for name in names:
        if not _NAME_RUN.fullmatch(name):
            if name in text:
                found.add(name)
            continue
        node = trie
        for char in name:
            node = node.setdefault(char, {})
        node[_END] = name
    if trie:
        for run in set(_NAME_RUN.findall(text)):
            for start in range(len(run)):
                node = trie
                for char in run[start:]:
                    node = node.get(char)
                    if node is None:
                        break
                    if _END in node:
                        found.add(node[_END])
    return [name for name in names if name not in found]
