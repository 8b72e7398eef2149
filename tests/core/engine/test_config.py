"""The engine's configuration (:mod:`core.engine.config`): one frozen value, checked when
it is made."""

from __future__ import annotations

import dataclasses

import pytest

from core.engine.config import EngineConfig
from core.engine.turns import PrefillSharing
from core.engine.types import Speculation
from kvcache.kv_format import KVFormat


def test_the_defaults_are_the_engines_own():
    config = EngineConfig()
    assert config.use_cache and config.disk_cache
    assert config.pool_tokens is None and config.kv_cache_path is None
    assert config.speculation == Speculation() and config.prefill_sharing == PrefillSharing()
    assert config.kv_format == KVFormat()


def test_it_is_frozen_and_changed_by_replacing():
    config = EngineConfig(pool_tokens=1024)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.pool_tokens = 2048
    assert dataclasses.replace(config, kv_bits=8).kv_format == KVFormat(8)
    assert config.pool_tokens == 1024


@pytest.mark.parametrize("bits, group", [(3, None), (8, 48)])
def test_a_bad_kv_format_is_refused_when_the_config_is_made(bits, group):
    with pytest.raises(ValueError, match="KV (bits|group size) must be one of"):
        EngineConfig(kv_bits=bits, kv_group_size=group)
