"""Fixtures shared by the tests of core/models: a data folder with its own empty HF cache,
and pip replaced by a fake wheel (tests/core/models/pypi/test_provision.py)."""

from tests.core.models.pypi.test_provision import data, fake_pip, index, no_pip  # noqa: F401
