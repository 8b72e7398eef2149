"""Fixtures of the engine tests: tiny models, loaded once a module (plain helpers are in
helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.models.tiny_model import TinyModelSpec, write_tiny_model
from tests.core.engine.helpers import load_tiny


@pytest.fixture(scope="module", params=["llama", "sliding", "recurrent"])
def loaded(request, tmp_path_factory):
    """A tiny model of every cache kind (llama: 2 layers; sliding and recurrent: 4), loaded."""
    return load_tiny(tmp_path_factory, request.param, num_layers=2 if request.param == "llama" else 4)


@pytest.fixture(scope="module", params=["llama", "sliding"])
def long_loaded(request, tmp_path_factory):
    """A tiny model of 2 layers with a 2048-token context (room for prompts of hundreds of
    tokens), loaded: llama, and sliding-window hybrid."""
    return load_tiny(tmp_path_factory, request.param, num_layers=2, max_position_embeddings=2048)


@pytest.fixture(scope="session")
def long_tiny_model(tmp_path_factory) -> Path:
    """The tiny llama model with a 4096-token context: room for a tool-laden prompt or a
    reply that outlasts a test (its tokens are bytes)."""
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-4k",
                            TinyModelSpec(num_layers=2, max_position_embeddings=4096))
