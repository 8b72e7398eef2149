"""``POST /v1/embeddings`` through the official ``openai`` client (and raw requests where a
client would not misbehave), on a tiny generated model; litellm's and LangChain's
embedding calls where they are installed, and the Vercel AI SDK's ``embed`` where node and
its packages are (tests/core/api/node/ai_sdk_embed.mjs); and the real default model, whose
vectors rank a sentence's paraphrase above unrelated sentences."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import subprocess
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI

from core.api.server import ApiServer
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import EmbeddingRequest
from core.models.tiny_model import TinyModelSpec, write_tiny_model

MODEL = "tiny"
NODE = Path(__file__).parent / "node"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("embeddings")
    model = write_tiny_model(root / MODEL, TinyModelSpec(num_layers=2))
    eng = Engine(
        root / "data", str(model), config=EngineConfig(pool_tokens=8192, disk_cache=False)
    ).start()
    eng.wait_ready(timeout=60)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    with ApiServer(engine, "127.0.0.1", 0) as api:
        yield api


@pytest.fixture
def client(server):
    with OpenAI(base_url=server.address + "/v1", api_key="unused", max_retries=0, timeout=30) as c:
        yield c


def raw(server, body, headers: dict | None = None, path: str = "/v1/embeddings"):
    """(status, response headers, parsed JSON) of one POST through http.client."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        conn.request(
            "POST", path, body=data, headers={"Content-Type": "application/json", **(headers or {})}
        )
        response = conn.getresponse()
        headers = {name.lower(): value for name, value in response.getheaders()}
        return response.status, headers, json.loads(response.read() or b"null")
    finally:
        conn.close()


def floats(client, inputs, **kw) -> list[list[float]]:
    reply = client.embeddings.create(model="any", input=inputs, encoding_format="float", **kw)
    return [item.embedding for item in reply.data]


def test_the_openai_client_gets_one_vector_per_input_with_usage(client, engine):
    texts = ["a red fox", "a blue whale", "x"]
    reply = client.embeddings.create(model="text-embedding-3-small", input=texts)
    assert reply.object == "list" and reply.model == MODEL
    assert [item.index for item in reply.data] == [0, 1, 2]
    assert all(item.object == "embedding" for item in reply.data)
    want = engine.embed(EmbeddingRequest(tuple(texts)))
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(want.token_counts) == 22
    # the client asked for base64 (its default) and decoded it: the engine's float32 vectors
    for item, vector in zip(reply.data, want.vectors):
        assert np.allclose(item.embedding, vector, rtol=0, atol=1e-7)
        assert abs(np.linalg.norm(item.embedding) - 1) < 1e-6


def test_base64_is_the_float_vectors_as_little_endian_float32(client):
    encoded = client.embeddings.create(model="m", input="hello", encoding_format="base64")
    vector = np.frombuffer(base64.b64decode(encoded.data[0].embedding), dtype="<f4")
    (plain,) = floats(client, "hello")
    assert vector.shape == (64,) and np.array_equal(vector, np.asarray(plain, dtype=np.float32))


def test_token_ids_in_both_shapes_are_the_texts_they_spell(client):
    by_text = floats(client, ["hi", "you"])
    assert floats(client, list(b"hi")) == by_text[:1]
    assert floats(client, [list(b"hi"), list(b"you")]) == by_text


def test_dimensions_shorten_and_scale_again(client):
    (full,) = floats(client, "shorten me")
    (short,) = floats(client, "shorten me", dimensions=16)
    head = np.asarray(full[:16])
    assert len(short) == 16 and np.allclose(short, head / np.linalg.norm(head), atol=1e-6)


@pytest.mark.parametrize(
    ("body", "param", "code", "message"),
    [
        ({"input": ""}, None, "invalid_value", "the input is an empty string"),
        ({"input": []}, "input", "invalid_value", "an empty list"),
        ({"input": [[1], []]}, None, "invalid_value", "input[1] is empty"),
        ({"input": [1, 2, 70000]}, None, "invalid_value", "70000 at position 2"),
        ({"input": [-3]}, "input[0]", None, "greater than or equal to 0"),
        ({"input": ["a", 1]}, "input[1]", "invalid_type", "valid string"),
        ({"input": "x" * 600}, "input", "context_length_exceeded", "tiny has a context of 512"),
        ({"input": "a", "dimensions": 0}, "dimensions", "invalid_value", "greater than or equal"),
        ({"input": "a", "dimensions": 65}, None, "invalid_value", "embeddings have 64"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", None, "'float' or 'base64'"),
        ({"input": ["a"] * 2049}, "input", "invalid_value", "at most 2,048"),
        ({}, "input", "missing_required_parameter", "'input' is required"),
    ],
)
def test_bad_requests_are_400s_that_say_what_is_wrong(server, body, param, code, message):
    status, _, reply = raw(server, body)
    error = reply["error"]
    assert status == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param and message in error["message"]
    if code is not None:
        assert error["code"] == code


def test_the_openai_client_raises_its_bad_request_error(client):
    with pytest.raises(openai.BadRequestError, match="context of 512"):
        client.embeddings.create(model="m", input="y" * 1000)


def test_embeddings_share_the_guard_of_every_route(engine):
    """An API key is required when set; a web page's Origin and a form's content type are
    refused; the reply names the key's cache namespace (a salt splits it)."""
    with ApiServer(engine, "127.0.0.1", 0, api_key="sesame") as api:
        status, _, reply = raw(api, {"input": "x"})
        assert status == 401 and reply["error"]["code"] == "invalid_api_key"
        key = {"Authorization": "Bearer sesame"}
        status, headers, _ = raw(api, {"input": "x"}, key)
        salted = raw(api, {"input": "x", "cache_salt": "s"}, key)[1]
        assert status == 200
        assert headers["x-radixchat-cache-namespace"] != salted["x-radixchat-cache-namespace"]
        status, _, reply = raw(api, {"input": "x"}, {**key, "Origin": "https://evil.example"})
        assert status == 403 and reply["error"]["code"] == "origin_not_allowed"
        status, _, reply = raw(
            api, {"input": "x"}, {**key, "Origin": "http://a.b", "Content-Type": "text/plain"}
        )
        assert status == 403
        with OpenAI(base_url=api.address + "/v1", api_key="sesame", max_retries=0) as c:
            assert len(c.embeddings.create(model="m", input="x").data[0].embedding) == 64


def test_a_form_post_from_a_page_allowed_to_call_is_still_not_json(engine):
    with ApiServer(engine, "127.0.0.1", 0, allow_origins=["http://app.local"]) as api:
        headers = {"Origin": "http://app.local", "Content-Type": "text/plain"}
        status, _, reply = raw(api, {"input": "x"}, headers)
        assert status == 415 and reply["error"]["code"] == "unsupported_media_type"


def test_embeddings_count_in_metrics_and_the_request_log(server, client):
    before = len(server.request_log.recent())
    client.embeddings.create(model="m", input=["one", "two"])
    logged = server.request_log.recent()[before:]
    assert [(e.path, e.prompt_tokens, e.error) for e in logged] == [("/v1/embeddings", 6, None)]
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    assert 'radixchat_http_requests_total{endpoint="/v1/embeddings",status="200"}' in text


# ------------------------------------------------------------------ third-party clients
# their imports warn about their own pydantic models (filterwarnings = error would fail them)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_litellm_embedding_returns_vectors(client, litellm):
    # through a client the test closes (litellm keeps the ones it makes, connections open)
    reply = litellm.embedding(model="openai/anything", input=["a fox", "a whale"], client=client)
    vectors = [item["embedding"] for item in reply.data]
    assert len(vectors) == 2 and all(len(v) == 64 for v in vectors)
    assert reply.usage.prompt_tokens == 12


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_langchain_openai_embeddings_return_vectors(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    with httpx.Client(timeout=30) as http:  # closed here, not left to the collector
        embeddings = langchain_openai.OpenAIEmbeddings(
            model="anything",
            base_url=server.address + "/v1",
            api_key="unused",
            # LangChain otherwise sends OpenAI's tiktoken ids (another vocabulary): docs/api.md
            check_embedding_ctx_length=False,
            http_client=http,
        )
        documents = embeddings.embed_documents(["a fox", "a whale"])
        query = embeddings.embed_query("a fox")
    assert len(documents) == 2 and all(len(v) == 64 for v in documents)
    assert np.allclose(query, documents[0], atol=1e-6)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.skipif(
    not (NODE / "node_modules" / "@ai-sdk" / "openai-compatible").is_dir(),
    reason="the AI SDK's npm packages are not installed (npm install --prefix tests/core/api/node)",
)
def test_the_ai_sdk_embed_returns_vectors(server):
    """``embed`` and ``embedMany`` through ``@ai-sdk/openai`` and ``@ai-sdk/openai-compatible``
    (issue 43: a 404 before /v1/embeddings), and the openai provider's ``dimensions``."""
    run = subprocess.run(
        ["node", str(NODE / "ai_sdk_embed.mjs"), server.address + "/v1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout)
    for provider in ("openai", "compatible"):
        reply = got[provider]
        assert reply["count"] == 2 and reply["lengths"] == [64, 64], provider
        assert all(abs(n - 1) < 1e-5 for n in reply["norms"]), provider
        # the tiny model's tokens are bytes: "a red fox" and "a blue whale"
        assert reply["tokens"] == 9 + 12 and reply["sameAlone"] > 1 - 1e-6, provider
    assert got["dimensions"]["length"] == 16 and abs(got["dimensions"]["norm"] - 1) < 1e-5


# ------------------------------------------------------------------ the real default model
@pytest.mark.real_model
def test_the_default_model_ranks_paraphrases_above_unrelated_sentences(data_root_with_default):
    """SmolLM2-135M, mean-pooled: each sentence is nearer its paraphrase than any of the
    other pairs' sentences (cosine similarity)."""
    pairs = [
        ("The cat sat on the mat.", "A cat was sitting on the mat."),
        (
            "Stock markets fell sharply after the central bank raised interest rates.",
            "Shares dropped steeply when the central bank increased interest rates.",
        ),
        ("How do I bake sourdough bread at home?", "What is a recipe for homemade sourdough?"),
    ]
    engine = Engine(
        data_root_with_default, "default", config=EngineConfig(pool_tokens=16384, disk_cache=False)
    )
    engine.start()
    try:
        engine.wait_ready(timeout=300)
        with (
            ApiServer(engine, "127.0.0.1", 0) as api,
            OpenAI(base_url=api.address + "/v1", api_key="unused", max_retries=0, timeout=300) as c,
        ):
            texts = [text for pair in pairs for text in pair]
            reply = c.embeddings.create(model="default", input=texts)
            vectors = np.array([item.embedding for item in reply.data])
            assert vectors.shape == (6, 576)
            similarity = vectors @ vectors.T
            for i in range(0, 6, 2):
                twin = similarity[i, i + 1]
                others = [similarity[i, j] for j in range(6) if j // 2 != i // 2]
                others += [similarity[i + 1, j] for j in range(6) if j // 2 != i // 2]
                assert twin > max(others), (texts[i], twin, max(others))
            # batched, the vectors are those each sentence gets alone
            alone = c.embeddings.create(model="default", input=texts[0], encoding_format="float")
            assert np.allclose(alone.data[0].embedding, vectors[0], atol=1e-5)
    finally:
        engine.shutdown()
