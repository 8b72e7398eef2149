"""A tiny generated model on one engine, shared by the API's test files that need a live server."""

from __future__ import annotations

import pytest

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.models.tiny_model import TinyModelSpec, write_tiny_model


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("api-engine")
    model = write_tiny_model(root / "tiny", TinyModelSpec(num_layers=2))
    engine = Engine(root / "data", str(model), config=EngineConfig(pool_tokens=8192)).start()
    engine.wait_ready(timeout=60)
    yield engine
    engine.shutdown()
