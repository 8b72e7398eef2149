"""The cache of every model family, below the engine: logits from a prefix served by the
page pool and snapshots, and from one restored from disk into a fresh cache (a restart),
agree within float32's rounding (1e-4 of the largest logit) with mlx-lm's own cache
objects continued from the same point, and with a from-scratch prefill of the whole
prompt (except where mlx-lm's model itself computes a continued prompt differently from a
whole one: ``CONTINUATION_DIFFERS``).

Greedy replies (``tests/core/engine/test_model_matrix.py``) can hide a small error (a
page a little off, a snapshot of the wrong moment) behind a wide top-1 margin; logits do
not. Marked ``model_matrix``, as the engine matrix is.
"""

from __future__ import annotations

import re
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from kvcache.builder import build_kv_cache
from kvcache.persist import DiskTier
from kvcache.prefix_cache import HOT_ENTRIES, PrefixCache
from tests.kvcache.family_weights import build_model
from tests.kvcache.model_families import FAMILIES, NEEDS_METAL, SKIPPED

pytestmark = pytest.mark.model_matrix

FP = "f" * 64
TOLERANCE = 1e-4  # of the largest logit (float32)
HISTORY = [(37 * i + 11) % 250 + 1 for i in range(70)]  # a chat so far: 70 byte-range tokens
RESUME = 40  # where the follow-up leaves the history (a snapshot is taken there too)
FOLLOW_UP = [(13 * i + 7) % 250 + 1 for i in range(6)]
# mlx-lm models whose own caches, continued, give other logits than one whole prefill
# (so a cache can only reproduce the continued ones); measured on these configs
CONTINUATION_DIFFERS = {
    "phi3small": (
        "its block-sparse attention masks blocks by query position within the call (7e-4 here)"
    ),
}


MODELS_MD = Path(__file__).resolve().parents[2] / "docs" / "models.md"
CACHED_AS_WORDS = {"pages": "pages", "both": "pages+snapshots", "snapshots": "snapshots"}


def documented() -> tuple[dict[str, str], dict[str, str]]:
    """docs/models.md's table (model type -> how it says the type is cached) and its list of
    the types left out (model type -> why)."""
    text = MODELS_MD.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([\w.-]+)` \| (\w+)[^|]* \|", text, re.MULTILINE)
    left_out = re.findall(r"^- `([\w.-]+)`: (.+)$", text, re.MULTILINE)
    return {name: CACHED_AS_WORDS[word] for name, word in rows}, dict(left_out)


def test_the_docs_list_every_family_and_every_skip_with_its_reason():
    table, left_out = documented()
    assert sorted(table) == sorted(FAMILIES)
    assert left_out == SKIPPED


def prefix_cache(model) -> PrefixCache:
    return PrefixCache(model, build_kv_cache(model, weight_bytes=0, page_size=8, pool_tokens=4096))


def cached_history(model, pc: PrefixCache):
    """mlx-lm caches holding ``HISTORY``, computed in two parts, and the snapshots at their ends."""
    caches, snapshots, done = make_prompt_cache(model), [], 0
    for end in (RESUME, len(HISTORY)):
        model(mx.array(HISTORY[done:end])[None], cache=caches)
        snapshot = pc.snapshot(caches, end)
        if snapshot is not None:
            snapshots.append(snapshot)
        done = end
    return caches, snapshots


def last_logits(model, parts: list[list[int]], caches=None) -> mx.array:
    """The last logits after running ``parts`` one after the other through ``caches``."""
    caches = make_prompt_cache(model) if caches is None else caches
    for part in parts:
        logits = model(mx.array(part)[None], cache=caches)
    return logits[0, -1].astype(mx.float32)


def assert_close(logits: mx.array, reference: mx.array, what: str) -> None:
    finite = mx.isfinite(reference)  # a family may mask ids out with -inf
    assert mx.array_equal(finite, mx.isfinite(logits)).item(), what
    error = mx.max(mx.abs(mx.where(finite, logits - reference, 0))).item()
    scale = mx.max(mx.abs(mx.where(finite, reference, 0))).item()
    assert error <= TOLERANCE * scale, (
        f"logits off by {error:.2e} (largest {scale:.2f}) against {what}"
    )


def assert_continues_exactly(model, pc: PrefixCache, prompt: list[int], family: str) -> int:
    """Match ``prompt``, build its caches, run the rest: the last logits are those of
    mlx-lm's own caches continued from the same point, and those of a whole prefill.
    Returns the matched length."""
    prefix = pc.match(prompt)
    try:
        caches = pc.make_caches(prefix, room=len(prompt) - prefix.length)
        logits = last_logits(model, [prompt[prefix.length :]], caches)
    finally:
        pc.release(prefix)
    n = prefix.length
    assert_close(logits, last_logits(model, [prompt[:n], prompt[n:]]), "mlx-lm's caches continued")
    if family not in CONTINUATION_DIFFERS:
        assert_close(logits, last_logits(model, [prompt]), "a whole prefill")
    return n


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_prefix_from_the_pool_and_from_disk_continues_exactly(family, tmp_path):
    if family in NEEDS_METAL and not mx.metal.is_available():
        pytest.skip(f"{family}: {NEEDS_METAL[family]}; this machine has no Metal")
    model = build_model(family)
    prompt = HISTORY[:RESUME] + FOLLOW_UP  # leaves the history at a snapshot

    pc = prefix_cache(model)
    assert pc.enabled, pc.build.disable_reason
    assert pc.build.layout.cached_as == documented()[0][family], "docs/models.md says otherwise"
    caches, snapshots = cached_history(model, pc)
    pc.commit(pc.match(HISTORY + [0]), HISTORY, caches, snapshots)
    for i in range(HOT_ENTRIES):  # the history's own cache objects are kept a while: not now
        other = [200 + i] * 3
        pc.commit(pc.match(other + [0]), other, *cached_other(model, pc, other))
    assert (
        assert_continues_exactly(model, pc, prompt, family) == RESUME
    )  # from the pool (and snapshots)

    writer = prefix_cache(model)
    caches, snapshots = cached_history(model, writer)
    persister = DiskTier(tmp_path / "kvcache.db", writer, FP)
    persister.save("chat", HISTORY, caches, snapshots)
    persister.close()
    fresh = prefix_cache(model)  # a restart: nothing in RAM
    persister = DiskTier(tmp_path / "kvcache.db", fresh, FP)
    try:
        assert persister.restore(prompt, "chat") == RESUME
        assert assert_continues_exactly(model, fresh, prompt, family) == RESUME  # from disk
    finally:
        persister.close()


def cached_other(model, pc: PrefixCache, tokens: list[int]):
    caches = make_prompt_cache(model)
    model(mx.array(tokens)[None], cache=caches)
    snapshot = pc.snapshot(caches, len(tokens))
    return caches, [snapshot] if snapshot is not None else []


def test_a_family_model_is_the_same_every_time():
    """mlx-lm draws a model's initial weights from MLX's global random state: seeded, a
    family's model is the same in every process (else a test could pass or fail by draw)."""
    from mlx.utils import tree_flatten

    first, second = (dict(tree_flatten(build_model("qwen3_next").parameters())) for _ in range(2))
    mx.random.normal((3,))  # whatever ran before
    third = dict(tree_flatten(build_model("qwen3_next").parameters()))
    assert first.keys() == second.keys() == third.keys()
    assert all(
        mx.array_equal(first[k], second[k]).item() and mx.array_equal(first[k], third[k]).item()
        for k in first
    )
