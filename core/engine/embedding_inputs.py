"""An embedding request's inputs as token ids, worked out on the client's thread.

Texts are tokenised as the model's tokenizer does, its special tokens added (as
sentence-transformers and llama.cpp tokenise what they embed); token ids are checked
against the vocabulary (an id past it would index past the embedding table). An input is
at most the model's context long (or ``--max-prompt-tokens``, if smaller): a longer one
is refused, naming it, or cut to fit when the request says ``truncate``. Before a text is
tokenised, the cheap check of :mod:`core.engine.prompt` (no token spells more characters
than the vocabulary's longest entry) refuses a text that cannot fit, or, truncating, cuts
it well past the last token kept. Nothing here imports mlx.
"""

from __future__ import annotations

from core.engine.prompt import PromptLimit, Prompts
from core.engine.types import EmbeddingRequest
from core.errors import ContextLengthError, UserError

# Truncating a long text: it is cut this many longest-entry lengths past the characters the
# kept tokens can span, so the cut (which may split a word) is far from the last kept token.
TRUNCATE_MARGIN = 16


def embedding_tokens(prompts: Prompts, request: EmbeddingRequest) -> list[list[int]]:
    """The token ids of each of ``request``'s inputs, in order. Raises UserError for an
    empty input or a token id outside the vocabulary, ContextLengthError for an input past
    the limit (unless ``request.truncate``)."""
    limit = input_limit(prompts.limit)
    several = len(request.inputs) > 1
    tokens = []
    for index, item in enumerate(request.inputs):
        where = f"input[{index}]" if several else "the input"
        if isinstance(item, str):
            ids = _text_tokens(prompts, item, limit, request.truncate, where)
        else:
            ids = list(item)
            _check_ids(ids, prompts.vocabulary_size, where)
        if not ids:
            raise UserError(f"{where} is empty: nothing to embed")
        if len(ids) > limit:
            if not request.truncate:
                raise _too_long(prompts.limit, where, f"{len(ids):,} tokens")
            ids = ids[:limit]
        tokens.append(ids)
    return tokens


def input_limit(limit: PromptLimit) -> int:
    """The most tokens one input may have: the whole context (nothing is generated after
    it), or the user's ``--max-prompt-tokens`` if smaller."""
    if limit.max_prompt_tokens is None:
        return limit.context_length
    return min(limit.context_length, limit.max_prompt_tokens)


def _text_tokens(prompts: Prompts, text: str, limit: int, truncate: bool, where: str) -> list[int]:
    if not text:
        raise UserError(f"{where} is an empty string: nothing to embed")
    longest = prompts.longest_entry
    if len(text) > limit * longest:
        if not truncate:
            at_least = -(-len(text) // longest)
            raise _too_long(
                prompts.limit, where, f"{len(text):,} characters, so at least {at_least:,} tokens,"
            )
        text = text[: (limit + TRUNCATE_MARGIN) * longest]
    return list(prompts.tokenizer.encode(text, add_special_tokens=True))


def _check_ids(ids: list, vocabulary: int, where: str) -> None:
    for position, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocabulary:
            raise UserError(
                f"{where} has {token!r} at position {position}: token ids of this model are "
                f"integers from 0 to {vocabulary - 1}"
            )


def _too_long(limit: PromptLimit, where: str, size: str) -> ContextLengthError:
    allowed = input_limit(limit)
    if allowed < limit.context_length:
        return ContextLengthError(
            f"{where} is {size} but inputs are limited to {allowed:,} tokens (--max-prompt-tokens)"
        )
    return ContextLengthError(
        f"{where} is {size} but {limit.model_name} has a context of {limit.context_length:,}"
    )
