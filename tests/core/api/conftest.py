"""A tiny generated model on one engine, shared by the API's test files that need a live server."""

from __future__ import annotations

import asyncio

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


@pytest.fixture
def litellm(monkeypatch):
    """litellm, or the test skipped where it is not installed. Its cost map is read from the
    package, not fetched from the internet. Its calls run with an event loop of the test's
    own, closed after: litellm's service logger takes the thread's event loop (which
    ``asyncio.get_event_loop`` makes where there is none) and never closes it, so a later
    test's ``asyncio.run`` left it to the garbage collector, whose ResourceWarning fails
    that test under ``filterwarnings = error``."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    module = pytest.importorskip("litellm")
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield module
    asyncio.set_event_loop(None)
    loop.close()
