"""Fixtures shared by the engine tests' modules."""

from __future__ import annotations

# the tiny model of each kind, loaded once a module (test_decode_batch's rows run on it too)
from tests.core.engine.test_scheduler import loaded  # noqa: F401
