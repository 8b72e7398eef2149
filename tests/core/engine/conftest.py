"""Fixtures of the engine tests: tiny models, loaded once a module (plain helpers are in
helpers.py)."""

from __future__ import annotations

import pytest

from tests.core.engine.helpers import load_tiny


@pytest.fixture(scope="module", params=["llama", "sliding", "recurrent"])
def loaded(request, tmp_path_factory):
    """A tiny model of every cache kind (llama: 2 layers; sliding and recurrent: 4), loaded."""
    return load_tiny(
        tmp_path_factory, request.param, num_layers=2 if request.param == "llama" else 4
    )


@pytest.fixture(scope="module", params=["llama", "sliding"])
def long_loaded(request, tmp_path_factory):
    """A tiny model of 2 layers with a 2048-token context (room for prompts of hundreds of
    tokens), loaded: llama, and sliding-window hybrid."""
    return load_tiny(tmp_path_factory, request.param, num_layers=2, max_position_embeddings=2048)
