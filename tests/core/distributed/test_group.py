"""A model split over 2 ranks on loopback (``radixchat serve --hosts``), end to end: greedy
replies the same as one process's, cached and not, after a restart of the group; each
rank's disk slice restores, a rank missing its slice costs a recompute; a killed rank
ends the request with an error naming its host, and a new group starts."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import pytest

from core.cli.serve_group import EXIT_GROUP_FAULT
from core.distributed.group import SILENCE_S
from core.distributed.outcome import ENDED_PREFIX
from core.distributed.shard import rank_cache_name
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.namespaces import API
from core.engine.types import ChatMessage, DoneEvent, GenerationRequest, SamplingParams
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.store import DiskStore
from kvcache.store_format import session_row
from tests.core.distributed.group_fixture import needs_ring, start_group
from tests.kvcache.family_weights import write_family

pytestmark = [needs_ring, pytest.mark.distributed]

TOKENS = 24
LYON = [{"role": "user", "content": "Plan a day in Lyon, please."}]
OTHER = [{"role": "user", "content": "Something else entirely: a poem about rain."}]
BATCH = [
    [{"role": "user", "content": f"Question number {i}, asked at the same time."}] for i in range(3)
]


def reference(model, conversations: list[list[dict]]) -> list[str]:
    """Greedy replies of one process, no cache at all."""
    (model.parent / "reference-data").mkdir(exist_ok=True)
    engine = Engine(
        model.parent / "reference-data",
        str(model),
        config=EngineConfig(use_cache=False, disk_cache=False),
    ).start()
    engine.wait_ready(120)
    try:
        replies = []
        for messages in conversations:
            request = GenerationRequest(
                messages=tuple(ChatMessage(m["role"], m["content"]) for m in messages),
                sampling=SamplingParams(temperature=0.0, max_tokens=TOKENS),
            )
            done = list(engine.stream(request))[-1]
            assert isinstance(done, DoneEvent), done
            replies.append(done.text)
        return replies
    finally:
        engine.shutdown()


def text(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def follow_up(first: str) -> list[dict]:
    return [
        *LYON,
        {"role": "assistant", "content": first},
        {"role": "user", "content": "And the evening?"},
    ]


def concurrent(group, conversations) -> list[dict]:
    replies = [None] * len(conversations)

    def ask(i):
        replies[i] = group.chat(conversations[i], max_tokens=TOKENS)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(conversations))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return replies


def first_group(group, expected: dict) -> None:
    """Uncached, cached (RAM), a session's follow-up, three requests decoded together."""
    a1 = group.chat(LYON, session="lyon", max_tokens=TOKENS)
    assert text(a1) == expected["lyon"] and cached(a1) == 0
    again = group.chat(LYON, max_tokens=TOKENS)
    assert text(again) == expected["lyon"] and cached(again) == a1["usage"]["prompt_tokens"] - 1
    a2 = group.chat(follow_up(text(a1)), session="lyon", max_tokens=TOKENS)
    assert text(a2) == expected["evening"] and cached(a2) > a1["usage"]["prompt_tokens"] - 1
    b1 = group.chat(OTHER, session="other", max_tokens=TOKENS)
    assert text(b1) == expected["other"]
    assert [text(r) for r in concurrent(group, BATCH)] == expected["batch"]
    # sampling without a seed: every rank draws the same (the random state is seeded alike)
    status, sampled = group.request({"messages": OTHER, "max_tokens": TOKENS, "temperature": 0.9})
    assert status == 200 and sampled["usage"]["completion_tokens"] > 0
    # a client that leaves mid-reply: the cancel lands at the same step on every rank
    conn, response = group.stream(LYON, max_tokens=4000)
    assert response.status == 200 and response.readline()
    response.close()
    conn.close()
    assert text(group.chat(OTHER, max_tokens=TOKENS)) == expected["other"]
    assert "out of step" not in group.output()  # every request ended alike on both ranks


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    # a long context: the killed-rank test needs a reply still running when the rank dies
    return write_tiny_model(
        tmp_path_factory.mktemp("dist") / "tiny-llama",
        TinyModelSpec(num_layers=2, max_position_embeddings=8192),
    )


def expectations(model) -> dict:
    """One process's greedy replies. A group computes them otherwise (split by heads, each
    rank's partial products summed across ranks, or by layers): different computations,
    compared by their greedy replies (``text``) and never by their bits."""
    replies = reference(model, [LYON, OTHER, *BATCH])
    evening = reference(model, [follow_up(replies[0])])[0]
    return {"lyon": replies[0], "other": replies[1], "batch": replies[2:], "evening": evening}


def test_a_split_llama_answers_as_one_process_restores_and_survives_a_killed_rank(llama, tmp_path):
    expected = expectations(llama)
    data = tmp_path / "data"
    group = start_group(llama, data, tmp_path)
    try:
        first_group(group, expected)
    finally:
        group.stop()
    assert group.launcher.returncode == 0, group.output()  # a clean stop (Ctrl-C)
    assert ENDED_PREFIX not in group.output()
    stores = [data / rank_cache_name(rank, 2) for rank in (0, 1)]
    assert all(store.exists() for store in stores)
    with DiskStore(stores[1]) as store:  # rank 1 loses one session's slice: that one is recomputed
        assert store.clear(session_row("other", API)) > 0

    group = start_group(llama, data, tmp_path)  # a restart of the group
    try:
        a2 = group.chat(follow_up(expected["lyon"]), session="lyon", max_tokens=TOKENS)
        assert text(a2) == expected["evening"]
        assert cached(a2) == a2["usage"]["prompt_tokens"] - 1  # both ranks restored their slices
        b1 = group.chat(OTHER, session="other", max_tokens=TOKENS)
        assert text(b1) == expected["other"]
        # rank 0 restored all of it, rank 1 only what it shares with "lyon" (the chat template's
        # first tokens): the ranks agreed on the shorter, the rest was recomputed
        assert 0 < cached(b1) < b1["usage"]["prompt_tokens"] - 1

        error, waited = stream_until_error(
            group, lambda: os.kill(group.rank_pid(1), signal.SIGKILL)
        )
        assert error is not None, group.output()
        assert "rank 1 (127.0.0.1)" in error["message"]
        assert waited < SILENCE_S  # the channel closing is seen at once, not by a heartbeat timeout
        # every rank exits, and so does `serve --hosts`, saying why, with a status that is not 0
        assert group.launcher.wait(60) == EXIT_GROUP_FAULT, group.output()
        # rank 0's own fault line ("left the group") or, when MLX's launcher drops a rank's last
        # output (core.distributed.outcome), its log of how rank 1 ended: either names the host
        assert re.search(
            re.escape(f"{ENDED_PREFIX}rank 1 (127.0.0.1) ")
            + "(left the group|was killed by SIGKILL)",
            group.output(),
        ), group.output()
    finally:
        group.stop()

    group = start_group(llama, data, tmp_path)  # a new group starts after the fault
    try:
        assert text(group.chat(LYON, session="lyon", max_tokens=TOKENS)) == expected["lyon"]
    finally:
        group.stop()


def stream_until_error(group, after) -> tuple[dict | None, float]:
    """Stream a long reply; call ``after()`` once it runs; the error event and how long
    after ``after()`` it came."""
    conn, response = group.stream(LYON, max_tokens=7000)
    try:
        assert response.status == 200
        assert b"content" in response.readline() or b"content" in response.readline()
        after()
        began = time.monotonic()
        for line in response:
            if line.startswith(b"data: {") and b'"error"' in line:
                return json.loads(line[6:])["error"], time.monotonic() - began
        return None, time.monotonic() - began
    finally:
        response.close()
        conn.close()


def test_a_split_hybrid_model_answers_as_one_process(tmp_path):
    model = write_tiny_model(
        tmp_path / "tiny-llama-sliding",
        TinyModelSpec(
            kind="llama-sliding", num_layers=4, sliding_window=16, max_position_embeddings=8192
        ),
    )
    expected = expectations(model)
    data = tmp_path / "data"
    group = start_group(model, data, tmp_path)
    try:
        first_group(group, expected)
    finally:
        group.stop()
    group = start_group(model, data, tmp_path)
    stopped = None
    try:
        a2 = group.chat(follow_up(expected["lyon"]), session="lyon", max_tokens=TOKENS)
        assert text(a2) == expected["evening"] and cached(a2) > 0  # restored to a snapshot's end

        def freeze():  # a host that stops answering, its connections open (asleep, cable out)
            nonlocal stopped
            stopped = group.rank_pid(1)
            os.kill(stopped, signal.SIGSTOP)

        error, waited = stream_until_error(group, freeze)
        assert error is not None, group.output()
        assert "rank 1 (127.0.0.1) stopped answering" in error["message"]
        assert waited < SILENCE_S + 5  # the heartbeat timeout, not a hang
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        group.stop()


def test_a_split_mla_and_linear_attention_model_answers_as_one_process_and_restores(tmp_path):
    # kimi_k3: MLA layers (a latent and a rope part, paged) after linear-attention layers
    # (state snapshotted), split by heads; every rank holds the whole latent
    from tests.core.distributed.test_pipeline import restarted_group_restores, stored_kv_shapes

    model = write_family(tmp_path / "tiny-kimi-k3", "kimi_k3", max_position_embeddings=8192)
    expected = expectations(model)
    data = tmp_path / "data"
    group = start_group(model, data, tmp_path)
    try:
        assert "1 of 2 KV heads each" in group.output()
        first_group(group, expected)
    finally:
        group.stop()
    for rank in (0, 1):  # the MLA layer's latent (1 x 16) and rope part (1 x 8), whole on each rank
        shapes = stored_kv_shapes(data / rank_cache_name(rank, 2))
        assert shapes and all(
            [(s[0], s[2]) for s in page] == [(1, 16), (1, 8)] for page in shapes
        ), shapes
    restarted_group_restores(model, data, tmp_path, expected)
