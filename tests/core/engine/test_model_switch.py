"""A model switch lets the old model go before the new one loads: after any number of
switches, memory is what one load of the current model takes; a switch that fails brings
the previous model back."""

from __future__ import annotations

import pytest

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ChatMessage, GenerationRequest, SamplingParams
from core.errors import UserError
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.engine.helpers import last_done

MB = 2**20
# big enough that a leaked copy shows plainly against the pool (about 24 MB of weights each)
WIDE = {"hidden_size": 512, "intermediate_size": 2048, "num_layers": 4, "num_heads": 8}


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("switch")
    return (
        write_tiny_model(root / "first", TinyModelSpec(**WIDE, seed=1)),
        write_tiny_model(root / "second", TinyModelSpec(**WIDE, seed=2)),
    )


def _reply(engine: Engine) -> str:
    request = GenerationRequest(
        messages=(ChatMessage("user", "hello"),),
        sampling=SamplingParams(temperature=0.0, max_tokens=4),
    )
    return last_done(list(engine.stream(request))).text


def test_five_switches_hold_one_model(two_models, tmp_path):
    first, second = two_models
    engine = Engine(tmp_path, str(first), config=EngineConfig(pool_tokens=512)).start()
    try:
        engine.wait_ready(timeout=120)
        _reply(engine)
        one_model = engine.stats()
        weights = one_model.model.weight_bytes
        assert weights > 20 * MB
        for spec in (second, first, second, first, second):
            assert engine.load(str(spec), timeout=120).path == str(spec)
            _reply(engine)
        after = engine.stats()
    finally:
        engine.shutdown()
    # the old weights went each time: within a tenth of one model's weights of one load
    assert abs(after.mlx_active_bytes - one_model.mlx_active_bytes) < weights / 10
    assert after.mlx_active_bytes < one_model.mlx_active_bytes + weights / 2


def test_a_failed_switch_brings_the_previous_model_back(two_models, tmp_path):
    first, _ = two_models
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)  # there, so the old model goes first; unreadable
    engine = Engine(tmp_path / "data", str(first), config=EngineConfig(pool_tokens=512)).start()
    try:
        engine.wait_ready(timeout=120)
        before = engine.model_info
        reply = _reply(engine)
        with pytest.raises(UserError):
            engine.load(str(broken), timeout=120)
        back = engine.model_info
        assert (back.spec, back.fingerprint) == (before.spec, before.fingerprint)
        assert _reply(engine) == reply  # greedy: the same model answers the same
    finally:
        engine.shutdown()
