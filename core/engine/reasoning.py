"""Reasoning models: their thinking taken out of the reply.

A reasoning model writes its thinking between two markers before its answer (Qwen3,
DeepSeek-R1 distills, Phi-4-reasoning: ``<think>`` ... ``</think>``; Magistral:
``[THINK]`` ... ``[/THINK]``). :func:`thinking_markup` finds the markers: mlx-lm's own
inference first (its ``TokenizerWrapper`` reads them off the vocabulary: ``has_thinking``,
``think_start``, ``think_end``, the same inference ``mlx_lm.server`` separates reasoning
with), then the pairs mlx-lm does not know yet, when the vocabulary has them as tokens and
the chat template writes them, then markers the chat template writes as plain text
(several tokens each).

:class:`ReasoningText` streams a reply's text split into thinking and answer with mlx-lm's
``TextStateMachine`` (what ``mlx_lm.server`` uses), given only the reasoning transitions:
the markers never reach either part, and a tail that could still become one is held back.
A reply starts inside its thinking when its prompt does (:func:`opens_thinking`: a template
that opens ``<think>`` in its generation prompt, as DeepSeek-R1's and Qwen3-Thinking's do),
read off the prompt's last tokens as ``mlx_lm.server`` reads it off the whole prompt.

Whitespace next to the markers is the model's layout, not text (Qwen3 writes
``<think>\\n...\\n</think>\\n\\n`` then the answer): the thinking is stripped at both ends,
and the answer's leading whitespace after the thinking goes (llama.cpp and vLLM do the
same), so neither part starts or ends with blank lines. A reply that never thinks is left
exactly as it is.

:meth:`ReasoningText.count` counts the reply's tokens spent thinking, by token id (the
markers included, as OpenAI's ``reasoning_tokens`` count them).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from mlx_lm.generate import TextStateMachine

REASONING, ANSWER = "reasoning", "normal"  # the state machine's names (mlx_lm.server's)
# markers mlx-lm 0.32 does not infer: taken when the vocabulary has both as tokens and the
# chat template writes them
MORE_MARKERS = (("[THINK]", "[/THINK]"),)  # Magistral (Mistral's tekken vocabulary)
TEXT_MARKERS = ("<think>", "</think>")  # written as text by a template whose vocabulary lacks them
# a reply starts inside its thinking when the prompt's last this many tokens open it
PROMPT_TAIL = 64


@dataclass(frozen=True)
class ThinkingMarkup:
    """How a model marks its thinking: the markers as text and as token ids."""

    start: str
    end: str
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]


def thinking_markup(tokenizer) -> ThinkingMarkup | None:
    """The thinking markers of ``tokenizer`` (an mlx-lm ``TokenizerWrapper``), or None for a
    model that does not think (see the module docstring for the order they are looked for)."""
    if getattr(tokenizer, "has_thinking", False):
        return ThinkingMarkup(
            tokenizer.think_start,
            tokenizer.think_end,
            tuple(tokenizer.think_start_tokens),
            tuple(tokenizer.think_end_tokens),
        )
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return None
    vocab = tokenizer.get_vocab()
    for start, end in MORE_MARKERS:
        if start in vocab and end in vocab and start in template and end in template:
            return ThinkingMarkup(start, end, (vocab[start],), (vocab[end],))
    start, end = TEXT_MARKERS
    if start in template and end in template:
        encode = tokenizer.encode
        return ThinkingMarkup(
            start,
            end,
            tuple(encode(start, add_special_tokens=False)),
            tuple(encode(end, add_special_tokens=False)),
        )
    return None


def opens_thinking(markup: ThinkingMarkup, prompt: list[int]) -> bool:
    """Whether the reply to ``prompt`` starts inside its thinking: the prompt's last
    ``PROMPT_TAIL`` tokens open the thinking after they last close it."""
    tail = prompt[-PROMPT_TAIL:]
    return _last_at(tail, markup.start_ids) > _last_at(tail, markup.end_ids)


def _last_at(ids: list[int], seq: tuple[int, ...]) -> int:
    """Where ``seq`` last starts in ``ids``; -1 where it does not occur."""
    n = len(seq)
    for at in range(len(ids) - n, -1, -1):
        if tuple(ids[at : at + n]) == seq:
            return at
    return -1


class ReasoningText:
    """Streams a reply's text split into its thinking and its answer (the module docstring
    says how). ``feed(piece)`` takes the next piece and returns ``(thinking, answer)``, the
    text of each now safe to send; ``finish()`` what is left when the reply ends;
    ``count(token)`` counts a generated token into ``tokens`` when it is spent thinking."""

    def __init__(self, markup: ThinkingMarkup, inside: bool = False):
        self.markup = markup
        machine = TextStateMachine(
            {ANSWER: [(markup.start, REASONING)], REASONING: [(markup.end, ANSWER)]}
        )
        self._state = machine.make_state(REASONING if inside else ANSWER)
        self._part = REASONING if inside else ANSWER  # the part the last text went to
        self._strip = inside  # strip the leading whitespace of the part that just began
        self._trailing = ""  # trailing whitespace of the thinking, sent once more of it comes
        self.tokens = 0
        self._inside_ids = inside
        self._recent: collections.deque[int] = collections.deque(
            maxlen=max(len(markup.start_ids), len(markup.end_ids), 1)
        )

    @property
    def thinking(self) -> bool:
        """The reply is inside its thinking now (as far as its text was fed)."""
        return self._state[0] == REASONING

    def feed(self, piece: str) -> tuple[str, str]:
        self._state, segments = TextStateMachine.split(self._state, piece)
        return self._sort(segments)

    def finish(self) -> tuple[str, str]:
        """What was held back, once the reply ended (a marker cut short is text)."""
        self._state, rest, part = TextStateMachine.flush(self._state)
        thinking, answer = self._sort([(part, rest)])
        self._trailing = ""  # the thinking's trailing whitespace: layout, dropped
        return thinking, answer

    def count(self, token: int) -> None:
        recent = self._recent
        recent.append(token)
        if self._inside_ids:
            self.tokens += 1
            if _ends_with(recent, self.markup.end_ids):
                self._inside_ids = False
        elif _ends_with(recent, self.markup.start_ids):
            self._inside_ids = True
            self.tokens += len(self.markup.start_ids)

    def _sort(self, segments: list[tuple[str, str]]) -> tuple[str, str]:
        thinking, answer = [], []
        for part, text in segments:
            if part != self._part:  # a marker between: the other part begins
                self._part, self._strip = part, True
                if part == ANSWER:
                    self._trailing = ""
            if self._strip:
                text = text.lstrip()
                self._strip = not text
            if not text:
                continue
            if part == REASONING:
                text = self._trailing + text
                body = text.rstrip()
                self._trailing = text[len(body) :]
                if body:
                    thinking.append(body)
            else:
                answer.append(text)
        return "".join(thinking), "".join(answer)


def _ends_with(recent: collections.deque[int], seq: tuple[int, ...]) -> bool:
    n = len(seq)
    return len(recent) >= n and tuple(recent)[-n:] == seq
