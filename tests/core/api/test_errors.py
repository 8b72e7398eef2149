"""A key with as many prompts waiting as the server queues for one (issue 42.2) gets a 429
with a Retry-After, in both dialects; the other keys go on."""

from __future__ import annotations

import threading

import anthropic
import openai
import pytest

from core.api.errors import RETRY_WAITING_S, engine_error
from core.api.server import ApiServer
from core.engine import namespaces
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.turns import PrefillSharing
from core.engine.types import GenerationRequest, ProgressEvent, SamplingParams
from core.errors import ErrorKind
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.api.helpers import wait_for

KEYS = ("key-of-a-0123456789", "key-of-b-9876543210")
ENGINE_THREAD = "radixchat-engine"


def test_a_full_queue_is_a_429_with_retry_after():
    from core.engine.types import ErrorEvent

    error = engine_error(ErrorEvent("too many requests waiting", ErrorKind.TOO_MANY_WAITING), True)
    assert error.status == 429 and error.headers == {"Retry-After": str(RETRY_WAITING_S)}
    assert error.body()["error"]["code"] == "too_many_waiting_requests"
    assert error.body_for("anthropic")["error"]["type"] == "rate_limit_error"


@pytest.fixture(scope="module")
def queue_of_one(tmp_path_factory):
    """A server whose keys may each have one prompt waiting, on a tiny model with room for a
    prompt of many chunks."""
    root = tmp_path_factory.mktemp("queue-of-one")
    model = write_tiny_model(
        root / "tiny", TinyModelSpec(num_layers=2, max_position_embeddings=4096)
    )
    engine = Engine(
        root / "data",
        str(model),
        config=EngineConfig(pool_tokens=8192, prefill_sharing=PrefillSharing(max_waiting=1)),
    ).start()
    engine.wait_ready(timeout=60)
    with ApiServer(engine, "127.0.0.1", 0, api_key=list(KEYS)) as server:
        yield engine, server
    engine.shutdown()


def test_a_keys_second_waiting_prompt_is_refused_with_a_429_the_other_key_is_served(queue_of_one):
    """Key A's long prompt is waiting (part-way through its prefill); A's next request is a
    429, B's is answered. The engine thread is held in the long prompt's first progress
    event until the other requests are queued: no timing decides the order."""
    engine, server = queue_of_one
    answers: dict[str, object] = {}

    def ask(name: str, key: str, dialect: str) -> None:
        try:
            if dialect == "openai":
                with openai.OpenAI(
                    base_url=server.address + "/v1", api_key=key, max_retries=0, timeout=60
                ) as client:
                    answers[name] = client.chat.completions.create(
                        model="tiny",
                        messages=[{"role": "user", "content": "hi"}],
                        max_tokens=2,
                        temperature=0,
                    )
            else:
                with anthropic.Anthropic(
                    base_url=server.address, api_key=key, max_retries=0, timeout=60
                ) as client:
                    answers[name] = client.messages.create(
                        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                    )
        except Exception as exc:  # the test reads it
            answers[name] = exc

    asking = [
        threading.Thread(target=ask, args=args)
        for args in (
            ("a openai", KEYS[0], "openai"),
            ("a anthropic", KEYS[0], "anthropic"),
            ("b", KEYS[1], "openai"),
        )
    ]
    held = threading.Event()

    def wake() -> None:
        events, _ = long.take()
        part_way = any(isinstance(e, ProgressEvent) and 0 < e.done < e.total for e in events)
        if held.is_set() or not part_way or threading.current_thread().name != ENGINE_THREAD:
            return
        held.set()  # on the engine thread, the long prompt part-way: the others come in now
        for thread in asking:
            thread.start()
        assert wait_for(lambda: engine._commands.qsize() == len(asking), timeout=60)

    long = engine.submit(
        GenerationRequest(
            prompt_text="x" * 3000,
            cache_namespace=namespaces.for_key(KEYS[0]),
            use_cache=False,
            sampling=SamplingParams(temperature=0.0, max_tokens=1),
        )
    )
    long.on_events(wake)
    assert wait_for(held.is_set, timeout=60)
    for thread in asking:
        thread.join(timeout=60)
    for name in ("a openai", "a anthropic"):
        refused = answers[name]
        assert isinstance(refused, (openai.RateLimitError, anthropic.RateLimitError)), refused
        assert refused.response.headers["retry-after"] == str(RETRY_WAITING_S)
        assert "--max-waiting" in refused.message
    assert isinstance(answers["b"], openai.types.chat.ChatCompletion), answers["b"]
    assert answers["b"].choices[0].finish_reason in ("length", "stop")
