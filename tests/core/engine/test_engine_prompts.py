"""Prompts are rendered and tokenised off the engine thread, within a size limit (issue 19:
an 8 MB message froze every stream for about 10 s before ending in a 400, because the
engine thread rendered and tokenised it)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import (
    ChatMessage,
    DoneEvent,
    ErrorEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from core.errors import ErrorKind
from core.models.load import loader
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.engine.helpers import start_engine

HUGE = 4_000_000  # characters: a message of several MB
ENGINE_THREAD = "radixchat-engine"
HOLD_S = 30  # a held render lets go by itself after this (only on a failure: the test lets it go)


def ask(text: str, max_tokens: int = 8) -> GenerationRequest:
    return GenerationRequest(
        messages=(ChatMessage("user", text),),
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
        use_cache=False,
    )


@pytest.fixture(scope="module")
def engine(long_tiny_model, tmp_path_factory):
    eng = start_engine(tmp_path_factory.mktemp("data"), long_tiny_model, pool_tokens=8192)
    yield eng
    eng.shutdown()


class TokenizerSpy:
    """Which threads render templates and tokenise; a huge prompt's rendering is held
    there until the test lets it go (or HOLD_S passes)."""

    def __init__(self, monkeypatch):
        self.threads: list[tuple[str, str]] = []  # (thread name, "template" | "encode")
        self.holding = threading.Event()
        self.release = threading.Event()
        self.released_by_test: bool | None = None
        render, encode = TokenizerWrapper.apply_chat_template, TokenizersBackend._encode_plus

        def spy_render(wrapper, messages, *args, **kwargs):
            self.threads.append((threading.current_thread().name, "template"))
            if sum(len(m["content"]) for m in messages) >= HUGE:
                self.holding.set()
                self.released_by_test = self.release.wait(HOLD_S)
            return render(wrapper, messages, *args, **kwargs)

        def spy_encode(backend, *args, **kwargs):
            self.threads.append((threading.current_thread().name, "encode"))
            return encode(backend, *args, **kwargs)

        monkeypatch.setattr(TokenizerWrapper, "apply_chat_template", spy_render)
        monkeypatch.setattr(TokenizersBackend, "_encode_plus", spy_encode)

    def on_engine_thread(self) -> list[str]:
        return [what for name, what in self.threads if name == ENGINE_THREAD]


def tokens(events, n: int) -> list[TokenEvent]:
    """The next ``n`` token events of a stream that must still be running."""
    got = []
    while len(got) < n:
        event = next(events)
        assert not isinstance(event, (DoneEvent, ErrorEvent)), f"the stream ended: {event}"
        if isinstance(event, TokenEvent):
            got.append(event)
    return got


def test_a_huge_message_never_holds_up_a_stream(engine, monkeypatch):
    spy = TokenizerSpy(monkeypatch)
    stream = engine.submit(ask("keep talking", max_tokens=4000))
    emitted: list = []  # what the engine has sent the stream (read or not)
    send = stream.emit
    stream.emit = lambda event: (emitted.append(event), send(event))
    events = stream.events(timeout=120)
    tokens(events, 1)
    huge = engine.submit(ask("z" * HUGE))
    assert spy.holding.wait(60), "the huge prompt was never rendered"
    # The huge prompt is held in its rendering: the engine sends the stream new tokens meanwhile.
    held_at = len(emitted)
    while sum(isinstance(e, TokenEvent) for e in emitted[held_at:]) < 5:
        tokens(events, 1)
    spy.release.set()
    refused = list(huge.events(timeout=120))
    assert spy.released_by_test, "the stream got no token while the huge prompt was being rendered"
    assert len(refused) == 1 and isinstance(refused[0], ErrorEvent), refused
    assert refused[0].kind is ErrorKind.CONTEXT_TOO_LONG and "\n" not in refused[0].message
    assert "characters" in refused[0].message  # refused on its length alone, never tokenised
    tokens(events, 5)  # still streaming after the refusal
    stream.cancel()
    assert [e for e in events if isinstance(e, DoneEvent)][0].stats.finish_reason == "cancelled"
    assert spy.on_engine_thread() == [], "the engine thread rendered or tokenised a prompt"


def test_no_prompt_is_rendered_or_tokenised_on_the_engine_thread(engine, monkeypatch):
    spy = TokenizerSpy(monkeypatch)
    done = list(engine.stream(ask("a chat message")))[-1]
    assert isinstance(done, DoneEvent) and done.stats.completion_tokens == 8
    raw = list(
        engine.stream(
            GenerationRequest(prompt_text="raw text", sampling=SamplingParams(max_tokens=2))
        )
    )
    assert isinstance(raw[-1], DoneEvent)
    assert engine.count_tokens(ask("counted")) > len("counted")
    assert {what for _, what in spy.threads} == {"template", "encode"}  # the spy sees the work
    assert spy.on_engine_thread() == []


def test_time_to_first_token_counts_the_prompts_rendering(engine, monkeypatch):
    render = TokenizerWrapper.apply_chat_template

    def slow_render(*args, **kwargs):
        time.sleep(0.3)  # a render that takes longer than the tiny model's prefill
        return render(*args, **kwargs)

    monkeypatch.setattr(TokenizerWrapper, "apply_chat_template", slow_render)
    handle = engine.submit(ask("slowly rendered"))
    done = list(handle.events(timeout=60))[-1]
    assert handle.prompt_s >= 0.3 and done.stats.ttft_s >= handle.prompt_s


def test_a_prompt_worked_out_for_the_previous_model_is_worked_out_again(
    long_tiny_model, tmp_path, monkeypatch
):
    """Sent while another model loads: its prompt was rendered for the old one, so the new
    model's template and tokenizer render it again."""
    other = write_tiny_model(
        tmp_path / "other", TinyModelSpec(num_layers=2, max_position_embeddings=4096)
    )
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "<|im_start|>system\nYou are the other model.<|im_end|>\n" + config["chat_template"]
    )
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    loading, go = threading.Event(), threading.Event()
    load = loader.load_model

    def held_load(*args, **kwargs):
        loading.set()
        go.wait(60)
        return load(*args, **kwargs)

    eng = Engine(
        tmp_path / "data", str(long_tiny_model), config=EngineConfig(pool_tokens=4096)
    ).start()
    try:
        eng.wait_ready(timeout=60)
        request = ask("which model?")
        before = eng.count_tokens(request)
        monkeypatch.setattr(loader, "load_model", held_load)
        switch = threading.Thread(target=eng.load, args=(str(other),))
        switch.start()
        assert loading.wait(60)
        handle = eng.submit(request)  # rendered for the model still loaded
        go.set()
        switch.join(60)
        done = list(handle.events(timeout=60))[-1]
        assert isinstance(done, DoneEvent), done
        after = eng.count_tokens(request)
        assert after > before + len("You are the other model.")  # its template adds a system turn
        assert done.stats.prompt_tokens == after
    finally:
        go.set()
        eng.shutdown()


def test_max_prompt_tokens_refuses_a_longer_prompt_before_the_engine(tiny_model, tmp_path):
    eng = Engine(
        tmp_path, str(tiny_model), config=EngineConfig(pool_tokens=1024, max_prompt_tokens=40)
    ).start()
    try:
        eng.wait_ready(timeout=60)
        events = list(eng.stream(ask("q" * 60)))
        assert len(events) == 1 and events[0].kind is ErrorKind.CONTEXT_TOO_LONG
        assert "limited to 40 tokens (--max-prompt-tokens)" in events[0].message
        assert isinstance(list(eng.stream(ask("short")))[-1], DoneEvent)
    finally:
        eng.shutdown()


def test_shutdown_finishes_a_request_whose_prompt_was_being_worked_out(tiny_model, tmp_path):
    eng = Engine(tmp_path, str(tiny_model), config=EngineConfig(pool_tokens=1024)).start()
    eng.wait_ready(timeout=60)
    handle = eng.submit(ask("submitted just before the end"))
    eng.shutdown()
    assert isinstance(list(handle.events(timeout=60))[-1], DoneEvent)


@pytest.mark.faults
def test_no_schema_is_checked_on_the_engine_thread(engine, monkeypatch):
    """Issue 26.2: the engine thread checked every tool's schema again (jsonschema: about
    10 µs a byte), holding every stream meanwhile. A prompt thread checks them now."""
    import jsonschema

    checked_on: list[str] = []
    original = jsonschema.Draft202012Validator.check_schema.__func__

    def spy(cls, schema, *args, **kwargs):
        checked_on.append(threading.current_thread().name)
        return original(cls, schema, *args, **kwargs)

    monkeypatch.setattr(jsonschema.Draft202012Validator, "check_schema", classmethod(spy))
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "description": f"unique {time.time()}",
    }
    request = GenerationRequest(
        messages=(ChatMessage("user", "a number"),),
        json_schema=schema,
        sampling=SamplingParams(temperature=0.0, max_tokens=4),
        use_cache=False,
    )
    events = list(engine.stream(request))
    assert isinstance(events[-1], (DoneEvent, ErrorEvent)), events[-1]
    assert checked_on and ENGINE_THREAD not in checked_on, checked_on
