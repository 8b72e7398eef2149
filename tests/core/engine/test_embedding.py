"""Embeddings through the engine (``Engine.embed``), on tiny generated models of every cache
kind: the vectors are the pooled final-norm states of each input alone, however the
inputs are batched or chunked; pooling follows the model's files; last-token pooling
reuses cached prefixes within a namespace; bad inputs are refused naming the input; an
embedding between decode steps changes nobody's reply."""

from __future__ import annotations

import json
import threading

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from core.engine import embedding
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import (
    DoneEvent,
    EmbeddingRequest,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from core.errors import ContextLengthError, UserError
from core.models.load.loader import load_model
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.models.load.test_pooling import st_folder

CONTEXT = 2048
# byte-level ids, so each character is a token; one input longer than a chunk (CHUNK)
TEXTS = (
    "hey",
    "x",
    "The quick brown fox jumps over the dog",
    "The quick brown fox jumped over a dog!",
    "A long one: " + "lorem ipsum dolor sit amet " * 24,
    "bye.",
)
TOLERANCE = 1e-5  # float32 models; a batch or a chunk may sum in another order


def start(path, data) -> Engine:
    engine = Engine(
        data, str(path), config=EngineConfig(pool_tokens=8192, disk_cache=False)
    ).start()
    engine.wait_ready(timeout=60)
    return engine


@pytest.fixture(scope="module", params=["llama", "sliding", "recurrent"])
def tiny(request, tmp_path_factory):
    """(model folder, engine) of a tiny model of each cache kind, with a 2048-token context."""
    root = tmp_path_factory.mktemp(request.param)
    spec = TinyModelSpec(
        kind=request.param,
        num_layers=2,
        max_position_embeddings=CONTEXT,
        sliding_window=32,
    )
    path = write_tiny_model(root / "m", spec)
    engine = start(path, root / "data")
    yield path, engine
    engine.shutdown()


def reference(path, texts, mode: str = "mean") -> list[list[float]]:
    """Each text's vector worked out here, alone, in one forward pass: the final-norm
    states of mlx-lm's model, pooled by ``mode``, scaled to length 1."""
    loaded = load_model(str(path), path.parent / "reference-data")
    vectors = []
    for text in texts:
        ids = loaded.tokenizer.encode(text)
        model = loaded.model
        states = model.model(mx.array([ids]), cache=make_prompt_cache(model))[0]
        states = states.astype(mx.float32)
        pooled = {"mean": states.mean(axis=0), "cls": states[0], "last": states[-1]}[mode]
        vectors.append((pooled / mx.linalg.norm(pooled)).tolist())
    return vectors


def farthest(a, b) -> float:
    return max(abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v))


def test_vectors_are_each_inputs_pooled_states_however_they_are_batched(tiny, monkeypatch):
    """Six inputs of 1 to 660 tokens in one request: their vectors are unit length, and each
    is the one the input gets alone (its own request) and the mean of the final-norm states
    worked out directly, within float32 rounding; the five short ones went together (fewer
    forward passes than inputs) and the long one in chunks."""
    path, engine = tiny
    steps = []
    real_step = embedding.EmbeddingJob.step
    monkeypatch.setattr(
        embedding.EmbeddingJob,
        "step",
        lambda job, *a: (
            steps.append(job.group.ids.shape if job.group else None) or real_step(job, *a)
        ),
    )
    together = engine.embed(EmbeddingRequest(TEXTS))
    forwards = len(steps)
    alone = [engine.embed(EmbeddingRequest((text,))).vectors[0] for text in TEXTS]
    assert together.token_counts == tuple(len(t) for t in TEXTS)
    assert together.pooling == "mean" and together.cached_tokens == 0
    for vector in together.vectors:
        assert len(vector) == 64 and abs(sum(x * x for x in vector) - 1) < 1e-5
    assert farthest(together.vectors, alone) < TOLERANCE
    assert farthest(together.vectors, reference(path, TEXTS)) < TOLERANCE
    # the five short inputs in one forward, the long one in two chunks (512 + 148)
    assert len(TEXTS[4]) > embedding.CHUNK and forwards == 3, steps


def test_identical_inputs_get_identical_vectors_and_different_ones_do_not(tiny):
    _, engine = tiny
    result = engine.embed(EmbeddingRequest(("same text", "same text", "other text")))
    same, twin, other = result.vectors
    assert same == twin and same != other


def test_dimensions_keep_the_first_components_scaled_to_length_one(tiny):
    _, engine = tiny
    full = engine.embed(EmbeddingRequest(("a sentence",))).vectors[0]
    short = engine.embed(EmbeddingRequest(("a sentence",), dimensions=8)).vectors[0]
    norm = sum(x * x for x in full[:8]) ** 0.5
    assert len(short) == 8
    assert max(abs(s - f / norm) for s, f in zip(short, full[:8])) < 1e-6
    with pytest.raises(UserError, match="dimensions is 65, but this model's embeddings have 64"):
        engine.embed(EmbeddingRequest(("a sentence",), dimensions=65))


def test_token_ids_are_embedded_as_the_text_they_spell(tiny):
    _, engine = tiny
    text = engine.embed(EmbeddingRequest(("hello",))).vectors[0]
    ids = engine.embed(EmbeddingRequest((tuple(b"hello"),))).vectors[0]
    assert text == ids


@pytest.mark.parametrize(
    ("inputs", "error", "message"),
    [
        (("",), UserError, "the input is an empty string"),
        (("ok", ()), UserError, r"input\[1\] is empty"),
        (
            ((1, 259),),
            UserError,
            "259 at position 1: token ids of this model are integers from 0 to 258",
        ),
        (((-1,),), UserError, "-1 at position 0"),
        (((True,),), UserError, "True at position 0"),
        (("ok", "x" * (CONTEXT + 1)), ContextLengthError, r"input\[1\] is 2,049 tokens but m has"),
        (("x" * 100_000,), ContextLengthError, "100,000 characters"),
    ],
)
def test_bad_inputs_are_refused_naming_the_input(tiny, inputs, error, message):
    _, engine = tiny
    with pytest.raises(error, match=message):
        engine.embed(EmbeddingRequest(inputs))


def test_an_input_too_long_is_cut_to_the_context_when_asked(tiny):
    _, engine = tiny
    long = "word " * 1000
    cut = engine.embed(EmbeddingRequest((long,), truncate=True))
    assert cut.token_counts == (CONTEXT,)
    assert cut.vectors == engine.embed(EmbeddingRequest((long[:CONTEXT],))).vectors


def test_an_embedding_between_decode_steps_changes_no_reply(tiny):
    """A reply being decoded while a request of many inputs is embedded is the reply it
    gets alone, and the vectors are those embedded while nothing else runs."""
    _, engine = tiny
    ask = GenerationRequest(
        prompt_text="Tell me a story about a fox.",
        sampling=SamplingParams(temperature=0.0, max_tokens=40),
        use_cache=False,
    )

    def reply() -> tuple[int, ...]:
        ids: list[int] = []
        for event in engine.stream(ask):
            if isinstance(event, TokenEvent):
                ids += event.token_ids
            elif isinstance(event, DoneEvent):
                return tuple(ids)
        raise AssertionError(f"no reply: {event}")

    inputs = tuple(f"input number {i}: " + "abc " * (i % 7) for i in range(40))
    quiet_reply, quiet_vectors = reply(), engine.embed(EmbeddingRequest(inputs)).vectors
    got: dict[str, object] = {}
    streaming = threading.Thread(target=lambda: got.update(reply=reply()))
    streaming.start()
    busy_vectors = engine.embed(EmbeddingRequest(inputs)).vectors
    streaming.join(timeout=120)
    assert got["reply"] == quiet_reply
    assert farthest(busy_vectors, quiet_vectors) < TOLERANCE


@pytest.fixture(scope="module")
def pooled_by(tmp_path_factory):
    """An engine on a tiny llama whose sentence-transformers files say to pool by ``mode``."""
    engines = []

    def make(mode: str):
        root = tmp_path_factory.mktemp(mode)
        path = write_tiny_model(root / "m", TinyModelSpec(max_position_embeddings=CONTEXT))
        st_folder(path, **{mode: True})
        engine = start(path, root / "data")
        engines.append(engine)
        return path, engine

    yield make
    for engine in engines:
        engine.shutdown()


def test_last_token_pooling_reuses_the_cached_prefix_of_its_namespace(pooled_by):
    """A model pooled by its last token needs the last position's state only, which a cached
    prefix's K/V gives: an input sharing an instruction prefix with the one before computes
    only the rest, with the vector it gets from scratch (within rounding) and the
    last-position state worked out directly. Another namespace gets no hit."""
    path, engine = pooled_by("lasttoken")
    prefix = "Instruct: find passages about the topic below.\nQuery: "
    first, second = prefix + "red foxes", prefix + "arctic wolves"
    assert engine.embed(EmbeddingRequest((first,), cache_namespace="a")).cached_tokens == 0
    hit = engine.embed(EmbeddingRequest((second,), cache_namespace="a"))
    fresh = engine.embed(EmbeddingRequest((second,), use_cache=False))
    elsewhere = engine.embed(EmbeddingRequest((second,), cache_namespace="b"))
    assert hit.pooling == "last" and hit.cached_tokens == len(prefix)
    assert fresh.cached_tokens == 0 and elsewhere.cached_tokens == 0
    assert farthest(hit.vectors, fresh.vectors) < 1e-4
    assert farthest(hit.vectors, reference(path, (second,), "last")) < 1e-4
    again = engine.embed(EmbeddingRequest((second,), cache_namespace="a"))
    assert again.cached_tokens == len(second) - 1  # the last token is always computed


def test_cls_pooling_takes_the_first_tokens_state(pooled_by):
    path, engine = pooled_by("cls_token")
    texts = ("first text", "second, longer text")
    result = engine.embed(EmbeddingRequest(texts))
    assert result.pooling == "cls" and result.token_counts == (10, 19)
    assert farthest(result.vectors, reference(path, texts, "cls")) < TOLERANCE


def test_a_model_that_cannot_be_run_as_meant_gives_no_embeddings(tmp_path):
    """A bidirectional embedding model (embeddinggemma's config) would give other vectors
    run causally: refused with why; its chat still works."""
    path = write_tiny_model(tmp_path / "m", TinyModelSpec())
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "use_bidirectional_attention": True}))
    engine = start(path, tmp_path / "data")
    try:
        with pytest.raises(UserError, match="m cannot give embeddings here: this model attends"):
            engine.embed(EmbeddingRequest(("text",)))
        ask = GenerationRequest(prompt_text="hi", sampling=SamplingParams(max_tokens=2))
        assert isinstance(list(engine.stream(ask))[-1], DoneEvent)
    finally:
        engine.shutdown()


def test_a_model_loaded_mid_request_starts_it_over_and_the_old_one_is_let_go(tmp_path):
    """Between two forward passes of a request the engine may load another model: the
    request starts over on the new one (its inputs tokenised again), and nothing it keeps
    holds the old model, whose memory goes before the new one loads."""
    import gc
    import weakref

    from core.engine.commands import EmbedCommand
    from core.engine.embedding import advance
    from core.engine.embedding_inputs import embedding_tokens
    from core.engine.prompt import PromptLimit, Prompts

    def loaded_and_prompts(seed: int, load: int):
        path = write_tiny_model(tmp_path / f"m{seed}", TinyModelSpec(seed=seed))
        loaded = load_model(str(path), tmp_path / "data")
        limit = PromptLimit(loaded.info.name, loaded.info.context_length)
        return loaded, Prompts(loaded.tokenizer, limit, load)

    old, old_prompts = loaded_and_prompts(1, load=1)
    request = EmbeddingRequest(tuple("x" * n for n in (100, 200, 300)))  # a forward each
    command = EmbedCommand(request, embedding_tokens(old_prompts, request), load=1)
    assert not advance(command, old, None, old_prompts)
    gone = [weakref.ref(old.model), weakref.ref(old.model.model)]  # the model, its layers
    del old
    gc.collect()
    assert [ref() for ref in gone] == [None, None], "the request keeps the old model alive"
    new, new_prompts = loaded_and_prompts(2, load=2)
    while not advance(command, new, None, new_prompts):
        pass
    assert command.done.is_set() and command.error is None
    assert farthest(command.result.vectors, reference(tmp_path / "m2", request.inputs)) < TOLERANCE
