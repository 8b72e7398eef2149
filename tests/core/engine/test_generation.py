"""The engine thread's per-request pieces on a tiny generated model: stop strings, the
vocabulary size, sampling tools and chunked, cancellable prefill."""

from __future__ import annotations

import random

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import make_prompt_cache

from core.engine import generation
from core.engine.generation import (
    LAST_CHUNK_OVER,
    PREFILL_CHUNK,
    ChunkedPrefill,
    StopText,
    sampling_tools,
    vocab_size,
)
from core.engine.types import SamplingParams
from core.models.load.loader import load_model


@pytest.fixture(scope="module")
def loaded(tiny_model, tmp_path_factory):
    return load_model(str(tiny_model), tmp_path_factory.mktemp("data"))


# ---------------------------------------------------------------- StopText


def test_stop_text_holds_back_partial_matches():
    stream = StopText(("END",))
    assert stream.feed("abc") == ("abc", False)
    assert stream.feed("E") == ("", False)
    assert stream.feed("N") == ("", False)
    assert stream.feed("x") == ("ENx", False)
    assert stream.feed("END tail") == ("", True)
    assert stream.feed("more") == ("", True)  # nothing after the stop


def test_stop_text_cuts_at_the_earliest_stop_and_shows_held_text_at_the_end():
    cut = StopText(("User:", "\n\n"))
    assert cut.feed("Hi\n\nUser: x") == ("Hi", True)
    assert cut.matched == "\n\n"  # the one that ended the text (the API reports it)
    both = StopText(("abcd", "bc"))
    assert both.feed("xabcd") == ("x", True) and both.matched == "abcd"  # the earliest start wins
    stream = StopText(("\n\n",))
    assert stream.feed("done.\n") == ("done.", False)
    assert stream.finish() == "\n"  # no more text: "\n" never became a stop
    ended = StopText(("END",))
    assert ended.feed("abE") == ("ab", False)
    assert ended.finish("ND") == ""  # the last bytes completed the stop


def test_stop_text_without_stops_passes_everything_and_ignores_empty_stops():
    stream = StopText(("",))
    assert stream.stops == ()
    assert stream.feed("a") == ("a", False) and stream.feed("b") == ("b", False)
    assert stream.finish("c") == "c" and not stream.hit


def streamed(stops: tuple[str, ...], text: str, sizes) -> tuple[str, bool]:
    """What a StopText shows of ``text`` fed in pieces of the given sizes (cycled)."""
    stream, shown, at, i = StopText(stops), "", 0, 0
    while at < len(text):
        size = sizes[i % len(sizes)]
        piece, hit = stream.feed(text[at : at + size])
        shown, at, i = shown + piece, at + size, i + 1
        if hit:
            return shown, True
    return shown + stream.finish(), False


def test_stop_text_streamed_pieces_add_up_to_the_text_before_the_stop():
    assert streamed(("STOP",), "one two ST three STOP four", [1]) == ("one two ST three ", True)
    assert streamed(("STOP",), "one two ST three STOP four", [3, 1, 7]) == (
        "one two ST three ",
        True,
    )
    assert streamed(("STOP",), "one two ST three STO", [2]) == ("one two ST three STO", False)


@pytest.mark.faults
def test_stop_text_agrees_with_a_search_of_the_whole_text_on_every_piece():
    """Issue 26.5: the check is incremental (each piece, never the whole reply again); what
    it shows is what searching the whole reply so far after each piece would show."""
    rng = random.Random(26)
    for trial in range(3000):
        alphabet = "ab" if trial % 2 else "abc\n"
        stops = tuple(
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
            for _ in range(rng.randint(1, 3))
        )
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        sizes = [rng.randint(1, 5) for _ in range(4)]
        expected, at, i = (text, False), 0, 0
        while at < len(text):  # the reference: a search of the whole text after each piece
            at, i = at + sizes[i % len(sizes)], i + 1
            found = [(pos, stop) for stop in stops if (pos := text[:at].find(stop)) != -1]
            if found:
                expected = (text[: min(found)[0]], True)
                break
        assert streamed(stops, text, sizes) == expected, (stops, text, sizes)


@pytest.mark.faults
def test_long_stop_strings_hold_back_only_what_could_still_match():
    """16 stop strings of 400,000 characters (the issue's case): the reply streams, a
    reply that spells a long start of one is held back, then shown once it turns away."""
    stops = tuple(chr(ord("A") + i) * 400_000 for i in range(16))
    stream, shown = StopText(stops), ""
    for _ in range(2000):
        piece, hit = stream.feed("word ")
        shown += piece
        assert not hit
    assert shown == "word " * 2000 and stream.pending == ""
    for _ in range(1000):
        assert stream.feed("BBBBB") == ("", False)  # 5,000 characters of a start of "BBB..."
    assert stream.feed("x") == ("B" * 5000 + "x", False)


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
    monkeypatch.setattr(
        generation, "make_sampler", lambda **kw: seen.append(kw["top_k"]) or real(**kw)
    )
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
@pytest.mark.parametrize("length", [1, 64, 200, PREFILL_CHUNK + 20, PREFILL_CHUNK + 70])
def test_prefill_gives_the_last_logits_and_fills_the_cache(loaded, length, size):
    tokens = [(7 * i + 3) % 200 + 1 for i in range(length)]
    cache = make_prompt_cache(loaded.model)
    chunks = []
    logits = prefill(loaded.model, tokens, cache, chunks.append, size=size)
    assert logits.shape == (1, loaded.config["vocab_size"])
    assert mx.allclose(logits, _reference_logits(loaded.model, tokens), rtol=1e-4, atol=1e-4).item()
    assert all(c.offset == length for c in cache)
    assert chunks[-1] == length and chunks == sorted(chunks)
    sizes = [b - a for a, b in zip([0] + chunks, chunks)]
    assert all(n == size for n in sizes[:-1])  # chunks keep to their size
    over = size + int(size * LAST_CHUNK_OVER)
    # the last call takes the rest: no tail left for a forward pass of its own
    assert sizes[-1] > over - size and sizes[-1] <= over if len(sizes) > 1 else length <= over


def test_a_follow_up_that_fits_in_a_chunk_is_one_forward_pass(loaded):
    calls = []
    model = loaded.model

    def counting(inputs, cache=None):
        calls.append(inputs.shape[1])
        return model(inputs, cache=cache)

    for length, want in ((200, [200]), (PREFILL_CHUNK + 50, [PREFILL_CHUNK + 50])):
        calls.clear()
        tokens = [(5 * i + 1) % 200 + 1 for i in range(length)]
        run = ChunkedPrefill(counting, tokens, make_prompt_cache(model))
        assert run.advance(PREFILL_CHUNK) == length and run.finished
        assert calls == want
    calls.clear()
    run = ChunkedPrefill(counting, list(range(1, 201)), make_prompt_cache(model), lambda n: None)
    while not run.finished:  # a hybrid model's: its state is snapshotted before the last token
        run.advance(PREFILL_CHUNK)
    assert calls == [199, 1]


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
