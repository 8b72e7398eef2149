"""The engine thread's per-request pieces on a tiny generated model: prompt rendering,
stop strings, the vocabulary size, sampling tools and chunked, cancellable prefill."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import make_prompt_cache

from core.engine import generation
from core.engine.generation import (PREFILL_CHUNK, SINGLE_CALL_TAIL, ChunkedPrefill, StopText, render_prompt,
                                    sampling_tools, vocab_size)
from core.engine.types import ChatMessage, GenerationRequest, SamplingParams
from core.errors import UserError
from core.models.loader import load_model


@pytest.fixture(scope="module")
def loaded(tiny_model, tmp_path_factory):
    return load_model(str(tiny_model), tmp_path_factory.mktemp("data"))


class PlainTokenizer:
    """A tokenizer without a chat template: one id per byte."""

    has_chat_template = False

    def encode(self, text: str) -> list[int]:
        return list(text.encode())


# ---------------------------------------------------------------- render_prompt


def test_prompt_tokens_are_taken_as_given(loaded):
    assert render_prompt(loaded.tokenizer, GenerationRequest(prompt_tokens=(5, 6, 7))) == [5, 6, 7]


def test_prompt_text_is_encoded_without_a_template(loaded):
    tokens = render_prompt(loaded.tokenizer, GenerationRequest(prompt_text="hello"))
    assert tokens == list(loaded.tokenizer.encode("hello"))
    assert loaded.tokenizer.decode(tokens).endswith("hello")


def test_messages_go_through_the_chat_template(loaded):
    messages = (ChatMessage("system", "be brief"), ChatMessage("user", "hi"))
    tokens = render_prompt(loaded.tokenizer, GenerationRequest(messages=messages))
    expected = loaded.tokenizer.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert tokens == list(expected)
    text = loaded.tokenizer.decode(tokens)
    assert "be brief" in text and text.index("be brief") < text.index("hi")


def test_messages_without_a_template_become_role_lines():
    request = GenerationRequest(messages=(ChatMessage("user", "hi"), ChatMessage("assistant", "yo")))
    assert bytes(render_prompt(PlainTokenizer(), request)) == b"user: hi\nassistant: yo\nassistant:"


@pytest.mark.parametrize("request_", [GenerationRequest(), GenerationRequest(prompt_text=""),
                                      GenerationRequest(prompt_tokens=())])
def test_an_empty_request_is_a_user_error(request_):
    with pytest.raises(UserError, match="empty"):
        render_prompt(PlainTokenizer(), request_)


# ---------------------------------------------------------------- StopText


def test_stop_text_holds_back_partial_matches():
    stream = StopText(("END",))
    assert stream.feed("abc") == ("abc", False)
    assert stream.feed("abcE") == ("", False)
    assert stream.feed("abcEN") == ("", False)
    assert stream.feed("abcENx") == ("ENx", False)
    assert stream.feed("abcENxEND tail") == ("", True)
    assert stream.emitted == len("abcENx")


def test_stop_text_cuts_at_the_earliest_stop_and_shows_held_text_at_the_end():
    cut = StopText(("User:", "\n\n"))
    assert cut.feed("Hi\n\nUser: x") == ("Hi", True)
    assert cut.matched == "\n\n"  # the one that ended the text (the API reports it)
    stream = StopText(("\n\n",))
    assert stream.feed("done.\n") == ("done.", False)
    assert stream.finish("done.\n") == "\n"  # no more text: "\n" never became a stop
    ended = StopText(("END",))
    assert ended.feed("abE") == ("ab", False)
    assert ended.finish("abEND") == ""  # the last bytes completed the stop


def test_stop_text_without_stops_passes_everything_and_ignores_empty_stops():
    stream = StopText(("",))
    assert stream.stops == ()
    assert stream.feed("a") == ("a", False) and stream.feed("ab") == ("b", False)
    assert stream.finish("abc") == "c" and not stream.hit


def test_stop_text_streamed_pieces_add_up_to_the_text_before_the_stop():
    text = "one two ST three STOP four"
    stream, shown = StopText(("STOP",)), ""
    for end in range(1, len(text) + 1):
        piece, hit = stream.feed(text[:end])
        shown += piece
        if hit:
            break
    assert shown == "one two ST three " and stream.hit


# ---------------------------------------------------------------- vocab_size, sampling_tools


def test_vocab_size_from_config_then_text_config_then_the_embedding(loaded):
    assert vocab_size(loaded.model, {"vocab_size": 77}) == 77
    assert vocab_size(loaded.model, {"text_config": {"vocab_size": 99}}) == 99
    rows = loaded.model.model.embed_tokens.weight.shape[0]
    assert vocab_size(loaded.model, {}) == rows == loaded.config["vocab_size"]
    assert vocab_size(nn.Linear(2, 2), {}) is None


def test_greedy_sampler_takes_the_argmax():
    sampler, processors = sampling_tools(SamplingParams(temperature=0.0))
    logprobs = mx.log(mx.softmax(mx.array([[0.1, 3.0, 0.2, 2.9]]), axis=-1))
    assert sampler(logprobs).item() == 1
    assert processors == []  # repetition penalty 1.0: no processor


def test_top_k_samples_only_the_k_best():
    sampler, _ = sampling_tools(SamplingParams(temperature=1.0, top_k=2, seed=0))
    logprobs = mx.log(mx.softmax(mx.array([[0.0, 5.0, 4.9, -1.0, 1.0]]), axis=-1))
    mx.random.seed(0)
    assert {sampler(logprobs).item() for _ in range(200)} == {1, 2}


def test_top_k_covering_the_vocabulary_is_no_filter(monkeypatch):
    seen = []
    real = generation.make_sampler
    monkeypatch.setattr(generation, "make_sampler", lambda **kw: seen.append(kw["top_k"]) or real(**kw))
    sampling_tools(SamplingParams(top_k=50), vocab=50)
    sampling_tools(SamplingParams(top_k=49), vocab=50)
    sampling_tools(SamplingParams(top_k=80))  # vocabulary unknown: as asked
    assert seen == [0, 49, 80]


def test_repetition_penalty_lowers_seen_tokens():
    _, processors = sampling_tools(SamplingParams(repetition_penalty=2.0))
    assert len(processors) == 1
    logits = mx.array([[4.0, 4.0, -4.0]])
    out = processors[0](mx.array([0, 2]), logits)
    assert out.tolist() == [[2.0, 4.0, -8.0]]


# ---------------------------------------------------------------- prefill


def _reference_logits(model, tokens):
    return model(mx.array(tokens)[None], cache=make_prompt_cache(model))[:, -1, :]


def prefill(model, tokens, cache, on_chunk, on_prefilled=None, size=PREFILL_CHUNK):
    run = ChunkedPrefill(model, tokens, cache, on_prefilled)
    while not run.finished:
        run.advance(size)
        on_chunk(run.done)
    return run.logits


@pytest.mark.parametrize("size", [PREFILL_CHUNK, 32, 5])
@pytest.mark.parametrize("length", [1, SINGLE_CALL_TAIL, SINGLE_CALL_TAIL + 1, PREFILL_CHUNK + 70])
def test_prefill_gives_the_last_logits_and_fills_the_cache(loaded, length, size):
    tokens = [(7 * i + 3) % 200 + 1 for i in range(length)]
    cache = make_prompt_cache(loaded.model)
    chunks = []
    logits = prefill(loaded.model, tokens, cache, chunks.append, size=size)
    assert logits.shape == (1, loaded.config["vocab_size"])
    assert mx.allclose(logits, _reference_logits(loaded.model, tokens), rtol=1e-4, atol=1e-4).item()
    assert all(c.offset == length for c in cache)
    assert chunks[-1] == length and chunks == sorted(chunks)
    assert all(b - a <= max(size, SINGLE_CALL_TAIL) for a, b in zip([0] + chunks, chunks))
    assert all(b - a <= size for a, b in zip([0] + chunks[:-1], chunks[:-1]))  # chunks keep to their size
    if length <= min(size, SINGLE_CALL_TAIL):
        assert chunks == [length]  # a short prompt is one call


def test_prefill_reports_when_all_but_the_last_token_are_in(loaded):
    tokens = list(range(1, 101))
    cache = make_prompt_cache(loaded.model)
    at = []

    def on_prefilled(done):
        at.append((done, cache[0].offset))

    logits = prefill(loaded.model, tokens, cache, lambda n: None, on_prefilled)
    assert at == [(99, 99)]
    assert mx.allclose(logits, _reference_logits(loaded.model, tokens), rtol=1e-4, atol=1e-4).item()


def test_a_prefill_advances_one_chunk_per_call(loaded):
    tokens = list(range(1, 3 * PREFILL_CHUNK))
    cache = make_prompt_cache(loaded.model)
    run = ChunkedPrefill(loaded.model, tokens, cache)
    assert run.advance(PREFILL_CHUNK) == PREFILL_CHUNK and not run.finished
    assert cache[0].offset == PREFILL_CHUNK  # nothing beyond the chunk
    assert run.advance(40) == 40 and cache[0].offset == PREFILL_CHUNK + 40
