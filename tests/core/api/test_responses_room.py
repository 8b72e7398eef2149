"""The stored responses' bounds through a live server on a tiny model: the store's share of
the data folder's disk budget split between the API keys (one key's stores never evict
another's), a chain of continuations growing linearly, the caps answered with a 413
before the model runs, a store that finds no room answering ``store: false``, and a
damaged ``responses.db`` set aside while serving."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import openai
import pytest

from core import paths
from core.api.responses_room import StoreBudget
from core.api.server import ApiServer
from core.engine.config import EngineConfig
from core.engine.engine import Engine

KEYS = ("erin-0123456789abcdef", "frank-fedcba9876543210")
DISK_BUDGET = 4 * 2**20  # the stored responses' share: 512 KB, 256 KB a key, 64 KB a response
# never read by the model, stored with the response: 16 values of 512 four-byte characters
HEAVY_METADATA = {f"k{i}": "😀" * 512 for i in range(16)}


@pytest.fixture(scope="module")
def server(long_tiny_model, tmp_path_factory):
    data = tmp_path_factory.mktemp("responses-room") / "data"
    engine = Engine(
        data,
        str(long_tiny_model),
        config=EngineConfig(pool_tokens=8192, disk_budget_bytes=DISK_BUDGET),
    )
    engine.start()
    try:
        engine.wait_ready(timeout=120)
        with ApiServer(engine, "127.0.0.1", 0, api_key=list(KEYS)) as api:
            yield api
    finally:
        engine.shutdown()


def client_of(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.address + "/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def erin(server):
    with client_of(server, KEYS[0]) as client:
        yield client


@pytest.fixture(scope="module")
def frank(server):
    with client_of(server, KEYS[1]) as client:
        yield client


def create(client, **body):
    return client.responses.create(model="default", max_output_tokens=2, **body)


def test_the_share_comes_from_the_disk_budget_split_between_the_keys(server):
    budget = server.state.responses.budget
    assert budget.total_bytes == paths.stored_responses_budget(DISK_BUDGET) == DISK_BUDGET // 8
    assert budget.owner_bytes == DISK_BUDGET // 16 and budget.item_bytes == DISK_BUDGET // 64


def test_one_key_never_evicts_anothers(server, erin, frank):
    """Today key A's 36 large stores evicted key B's response (GET and continuation 404)."""
    kept = create(frank, input="Frank's question")
    made = [create(erin, input=f"Erin {i}", metadata=HEAVY_METADATA).id for i in range(12)]
    assert frank.responses.retrieve(kept.id).id == kept.id
    assert create(frank, input="more", previous_response_id=kept.id).previous_response_id == kept.id
    with pytest.raises(openai.NotFoundError):  # Erin's own oldest made room
        erin.responses.retrieve(made[0])
    assert erin.responses.retrieve(made[-1]).id == made[-1]
    store = server.state.responses
    assert store.usage() <= store.budget.total_bytes


def test_a_chain_of_continuations_grows_linearly(server, erin):
    """Today every stored row repeated the whole conversation (one reached 337 MB)."""
    store = server.state.responses
    owner = next(iter(store.budget.owners))
    previous, sizes = None, []
    for i in range(6):
        reply = create(erin, input=f"Turn {i}: " + "word " * 60, previous_response_id=previous)
        previous = reply.id
        sizes.append(store.history(reply.id, owner).bytes)
    steps = [b - a for a, b in zip(sizes, sizes[1:], strict=False)]
    assert max(steps) < 1.2 * min(steps)  # each link adds its own turn, not the conversation


def test_a_response_past_the_cap_is_a_413_before_the_model_runs(server, erin):
    # a schema is echoed with the response and stored, but never rendered into the prompt
    schema = {"type": "object", "description": "x" * 70_000}
    text = {"format": {"type": "json_schema", "name": "big", "schema": schema}}
    with pytest.raises(openai.APIStatusError) as error:
        create(erin, input="hi", text=text)
    assert error.value.status_code == 413 and error.value.body["code"] == "stored_too_large"
    assert "may take 65,536" in error.value.body["message"]
    assert create(erin, input="hi", text=text, store=False).store is False  # not stored: fine


def test_a_conversation_past_the_keys_share_is_a_413(server, frank):
    previous = None
    with pytest.raises(openai.APIStatusError) as error:
        for i in range(12):  # 34 KB a link, 256 KB a key
            previous = create(
                frank, input=f"link {i}", metadata=HEAVY_METADATA, previous_response_id=previous
            ).id
    assert error.value.status_code == 413
    assert error.value.body["code"] == "conversation_too_large"
    assert error.value.body["param"] == "previous_response_id"
    assert frank.responses.retrieve(previous).id == previous  # the chain is still whole


def test_a_store_with_no_room_answers_store_false(server, erin):
    store = server.state.responses
    kept = store.budget
    store.budget = StoreBudget(kept.total_bytes, kept.owners, reserve_bytes=2**62)  # no room
    try:
        reply = create(erin, input="Not kept")
        with erin.responses.create(
            model="default", input="Not kept either", max_output_tokens=2, stream=True
        ) as events:
            *_, last = events
    finally:
        store.budget = kept
    assert reply.store is False and last.response.store is False
    for rid in (reply.id, last.response.id):
        with pytest.raises(openai.NotFoundError):
            erin.responses.retrieve(rid)


def test_a_damaged_file_is_set_aside_while_serving(server, frank):
    """Today: POST 200 with store: true but nothing stored; GET 503 until deleted by hand."""
    store = server.state.responses
    for i in range(20):
        create(frank, input=f"fill {i}", metadata={"pad": "p" * 500})
    store.close()
    path = store.path
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    kept = create(frank, input="After the damage")
    assert kept.store is True and frank.responses.retrieve(kept.id).id == kept.id
    assert create(frank, input="and on", previous_response_id=kept.id).output
    assert path.with_name("responses.db.damaged-1").exists()
