"""Cache namespaces through the engine: the PIN attack of issue 19 replayed on a tiny model,
in RAM and on disk after a restart. Across namespaces the attacker sees the same
``cached_tokens`` for every guess; inside the victim's namespace the same attack recovers
the PIN (so the test can fail)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.engine import namespaces
from core.engine.engine import Engine
from core.engine.types import DoneEvent, GenerationRequest, RequestStats, SamplingParams
from tests.core.engine.pin_attack import attack, learned_nothing, victim_prompt

ONE_TOKEN = SamplingParams(temperature=0.0, max_tokens=1)
PINS = ("4831", "2907")


def run(engine: Engine, text: str, namespace: str, session: str | None = None) -> RequestStats:
    request = GenerationRequest(
        prompt_text=text, sampling=ONE_TOKEN, cache_namespace=namespace, session=session
    )
    done = list(engine.stream(request))[-1]
    assert isinstance(done, DoneEvent), done
    return done.stats


def served(stats: RequestStats) -> int:
    return stats.cached_tokens + stats.restored_tokens  # what usage.cached_tokens says


def start(data: Path, model: Path, **options) -> Engine:
    data.mkdir(exist_ok=True)
    engine = Engine(data, str(model), pool_tokens=4096, **options).start()
    engine.wait_ready(60)
    return engine


def probe(engine: Engine, namespace: str):
    return lambda prompt: served(run(engine, prompt, namespace))


@pytest.mark.parametrize(
    "attacker", ["same", namespaces.with_salt(namespaces.API, "mine"), namespaces.API]
)
def test_the_pin_attack_in_ram(tmp_path, tiny_model, attacker):
    victim = namespaces.for_key("victim's key")
    results = []
    for pin in PINS:
        engine = start(tmp_path / pin, tiny_model, disk_cache=False)
        try:
            stats = run(engine, victim_prompt(pin), victim, session="secrets")
            assert stats.cache_namespace == namespaces.label(
                victim
            ) and stats.cache_namespace.startswith("key-")
            guess, seen = attack(probe(engine, victim if attacker == "same" else attacker))
        finally:
            engine.shutdown()
        results.append((pin, guess, seen))
    if attacker == "same":  # one namespace: the attack works, so the check below can fail
        assert all(guess == pin and not learned_nothing(seen) for pin, guess, seen in results)
        return
    for pin, guess, seen in results:
        assert guess != pin and learned_nothing(seen), seen
    assert results[0][2] == results[1][2]  # what it saw does not depend on the PIN at all


@pytest.mark.parametrize("attacker", ["same", namespaces.API])
def test_the_pin_attack_on_disk_after_a_restart(tmp_path, tiny_model, attacker):
    victim = namespaces.APP
    results = []
    for pin in PINS:
        data = tmp_path / pin
        first = start(data, tiny_model, disk_min_tokens=1)
        try:
            run(first, victim_prompt(pin), victim, session="secrets")
            run(first, victim_prompt(pin)[:-5], victim)  # an unnamed chain too, kept by its tokens
            first.flush_disk_cache()
        finally:
            first.shutdown()
        second = start(data, tiny_model, disk_min_tokens=1)  # RAM is empty: only the disk knows
        try:
            namespace = victim if attacker == "same" else attacker
            guess, seen = attack(probe(second, namespace))
            restored = second.stats().disk.read_tokens
        finally:
            second.shutdown()
        results.append((pin, guess, seen, restored))
    if attacker == "same":
        assert all(guess == pin and restored > 0 for pin, guess, _, restored in results)
        return
    for pin, guess, seen, restored in results:
        assert guess != pin and learned_nothing(seen) and restored == 0, seen
    assert results[0][2] == results[1][2]


def test_a_system_prompt_is_still_shared_inside_a_namespace(tmp_path, tiny_model):
    engine = start(tmp_path, tiny_model, disk_cache=False)
    system = "You are a careful assistant who answers in one short line. " * 2
    try:
        run(engine, system + "First question?", namespaces.APP, session="one")
        again = run(engine, system + "Another chat entirely.", namespaces.APP, session="two")
        elsewhere = run(engine, system + "Another chat entirely.", namespaces.API)
    finally:
        engine.shutdown()
    assert served(again) >= len(system) and again.cache_namespace == "app"
    assert served(elsewhere) == 0 and elsewhere.cache_namespace == "api"
