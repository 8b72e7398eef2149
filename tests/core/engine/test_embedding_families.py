"""Every text model type of the installed mlx-lm either gives embeddings from the hidden
states its output head reads or is refused with why (``core.mlx_lm_compat.hidden_states``).

For each family of ``tests/kvcache/model_families.py``, the member ``hidden_states``
picks is checked against the model itself: the family's output head applied to those
states gives, at every position, the token the model's own logits rank first (the heads
differ by family: a separate projection, the tied embedding, a soft cap or a scale after
it, none of which changes the top token). So the states are the final norm's output, not
an earlier layer's, and not already logits. A family refused must be one whose member is
not such states (the table names no family that would have worked).

Marked ``model_matrix`` with the engine's family matrix (``-m "not model_matrix"`` skips it).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import make_prompt_cache

from core.mlx_lm_compat import HIDDEN_STATE_MEMBERS, NO_HIDDEN_STATES, hidden_states
from tests.kvcache.family_weights import build_model
from tests.kvcache.model_families import FAMILIES, NEEDS_METAL

pytestmark = pytest.mark.model_matrix

RANKED = 20  # top tokens whose order must agree (a norm's weights near 1 change it past a few)
TOKENS = mx.array([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]])
# where the families keep their token embedding (a tied head is its ``as_linear``)
EMBEDDINGS = ("embed_tokens", "embedding", "wte", "tok_embeddings", "token_embeddings", "embed_in")


def heads(model, body) -> list:
    """Every output head ``model`` may apply to ``body``'s states: its projection
    (``lm_head``, ``output``; an array ``lm_head`` is multiplied by), its language model's,
    or a tied embedding."""
    found = []
    for owner in (model, getattr(model, "language_model", None)):
        for name in ("lm_head", "output"):
            head = getattr(owner, name, None) if owner is not None else None
            if isinstance(head, mx.array):
                found.append(lambda x, w=head: x @ w.T)
            elif isinstance(head, nn.Module):
                found.append(head)
    for name in EMBEDDINGS:
        table = getattr(body, name, None)
        if table is not None and hasattr(table, "as_linear"):
            found.append(table.as_linear)
    return found


def top_tokens_agree(head, states: mx.array, logits: mx.array) -> bool:
    """Whether ``head(states)`` ranks the ``RANKED`` top tokens of every position as
    ``logits`` do (a soft cap or a scale after the head keeps the order)."""
    try:
        projected = head(states)
    except (ValueError, TypeError):
        return False
    if projected.shape != logits.shape:
        return False
    ranked = mx.argsort(-projected.astype(mx.float32), axis=-1)[..., :RANKED]
    return bool(
        mx.array_equal(ranked, mx.argsort(-logits.astype(mx.float32), axis=-1)[..., :RANKED]).item()
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_gives_its_heads_input_or_is_refused(family):
    if family in NEEDS_METAL and not mx.metal.is_available():
        pytest.skip(f"{family}: {NEEDS_METAL[family]}; this machine has no Metal")
    model = build_model(family)
    logits = model(TOKENS, cache=make_prompt_cache(model))
    body, why = hidden_states(model)
    module = type(model).__module__
    if body is None:
        assert module in NO_HIDDEN_STATES and why == NO_HIDDEN_STATES[module]
        member = next(m for path in HIDDEN_STATE_MEMBERS if (m := _member(model, path)) is not None)
        try:
            out = member(TOKENS, cache=make_prompt_cache(model))
        except TypeError:
            return  # it cannot even be called as the others are
        # what it gives is already the logits: the head is inside it
        assert out.shape == logits.shape, f"{family} is refused but gives {out.shape}"
        return
    states = body(TOKENS, cache=make_prompt_cache(model))
    assert states.ndim == 3 and states.shape[:2] == TOKENS.shape
    assert any(top_tokens_agree(head, states, logits) for head in heads(model, body)), (
        f"{family}: no output head applied to the states {module}'s member gives the "
        "model's own top tokens"
    )


def _member(model, path: str):
    for name in path.split("."):
        model = getattr(model, name, None)
    return model
