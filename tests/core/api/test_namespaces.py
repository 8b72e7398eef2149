"""Cache namespaces through the HTTP API: one per API key, split by a request's cache_salt
(OpenAI's body field, as vLLM's; on /v1/messages the body's or metadata's). The PIN
attack of issue 19, replayed over HTTP with the official clients: another key, or no
salt, learns nothing; the same key and salt recover the PIN (so the test can fail)."""

from __future__ import annotations

import anthropic
import openai
import pytest

from core.api.server import ApiServer
from core.engine import namespaces
from tests.core.engine.pin_attack import attack, learned_nothing, victim_prompt

KEYS = ("alice-0123456789abcdef", "mallory-fedcba9876543210")


@pytest.fixture(scope="module")
def keyed(tiny_engine):
    with ApiServer(tiny_engine, "127.0.0.1", 0, api_key=list(KEYS)) as server:
        yield server


def completions(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.address + "/v1", api_key=key, max_retries=0, timeout=30)


def complete(client: openai.OpenAI, text: str, **extra):
    return client.completions.with_raw_response.create(
        model="default", prompt=text, max_tokens=1, temperature=0, extra_body=extra or None
    )


def served(raw) -> int:
    return raw.parse().usage.prompt_tokens_details.cached_tokens


@pytest.mark.parametrize("attacker", [KEYS[0], KEYS[1]])
def test_the_pin_attack_across_api_keys(keyed, attacker):
    pin = "4831" if attacker == KEYS[1] else "5316"
    with completions(keyed, KEYS[0]) as alice, completions(keyed, attacker) as client:
        complete(alice, victim_prompt(pin))
        guess, seen = attack(lambda prompt: served(complete(client, prompt)))
    if attacker == KEYS[0]:  # the victim's own key: the attack works
        assert guess == pin and not learned_nothing(seen)
    else:
        assert guess != pin and learned_nothing(seen), seen


def test_each_key_is_reported_by_a_label_never_the_key(keyed):
    labels = set()
    for key in KEYS:
        with completions(keyed, key) as client:
            raw = complete(client, "Which namespace am I in?")
            body = raw.parse()
        label = raw.headers["x-radixchat-cache-namespace"]
        assert label == namespaces.label(namespaces.for_key(key)) and label.startswith("key-")
        assert body.usage.model_extra["radixchat"]["cache_namespace"] == label
        assert key not in raw.http_response.text and all(key not in v for v in raw.headers.values())
        labels.add(label)
    assert len(labels) == 2
    with completions(keyed, "not-a-key") as stranger, pytest.raises(openai.AuthenticationError):
        complete(stranger, "let me in")


@pytest.fixture(scope="module")
def messages(server_without_keys):
    with anthropic.Anthropic(
        base_url=server_without_keys.address, api_key="unused", max_retries=0, timeout=30
    ) as client:
        yield client


@pytest.fixture(scope="module")
def server_without_keys(tiny_engine):
    with ApiServer(tiny_engine, "127.0.0.1", 0) as server:
        yield server


def ask(
    client: anthropic.Anthropic,
    text: str,
    metadata: dict | None = None,
    cache_salt: str | None = None,
):
    """One message; ``cache_salt`` goes in the body (extra_body: the client knows no such field)."""
    body = {"temperature": 0, **({"cache_salt": cache_salt} if cache_salt is not None else {})}
    return client.messages.with_raw_response.create(
        model="default",
        max_tokens=1,
        messages=[{"role": "user", "content": text}],
        extra_body=body,
        **({"metadata": metadata} if metadata is not None else {}),
    )


@pytest.mark.parametrize("salted", [True, False])
def test_a_cache_salt_keeps_a_local_clients_prompts_to_itself(messages, salted):
    """Loopback, no keys: one shared "api" namespace, which a salt splits (on /v1/messages the
    victim sends it in metadata, the attacker in the body: the same salt)."""
    pin = "7302" if salted else "1968"
    victim = ask(messages, victim_prompt(pin), metadata={"cache_salt": "victim's secret salt"})
    assert victim.headers["x-radixchat-cache-namespace"].startswith("api+salt-")
    assert victim.parse().usage.model_extra["radixchat"]["cache_namespace"].startswith("api+salt-")
    extra = {"cache_salt": "victim's secret salt"} if salted else {}

    def probe(prompt: str) -> int:
        return ask(messages, prompt, **extra).parse().usage.cache_read_input_tokens

    guess, seen = attack(probe)
    if salted:  # the same salt is the same namespace
        assert guess == pin and not learned_nothing(seen)
    else:
        assert guess != pin and learned_nothing(seen), seen


def test_unsalted_local_clients_share_one_namespace(server_without_keys):
    with (
        completions(server_without_keys, "unused") as one,
        completions(server_without_keys, "other") as two,
    ):
        text = "A long shared agent system prompt, the same for every sub-agent. " * 2
        complete(one, text + "first")
        raw = complete(two, text + "second")
    assert served(raw) >= len(text) and raw.headers["x-radixchat-cache-namespace"] == "api"


def test_two_different_salts_in_one_request_are_refused(messages):
    with pytest.raises(anthropic.BadRequestError, match="cache_salt"):
        ask(messages, "hi", metadata={"cache_salt": "a"}, cache_salt="b")
    with pytest.raises(anthropic.BadRequestError):
        ask(messages, "hi", cache_salt="")
