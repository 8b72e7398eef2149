"""What an engine is set up with besides its model: one frozen value, made once by each
front end (the command line's options: ``core.cli.commands.options.engine_config_of``; the
app's Preferences: ``app.settings_dialogs.AppSettings.engine_config``) and handed to
:class:`core.engine.engine.Engine`.

    engine = Engine(data_root, "default", config=EngineConfig(pool_tokens=4096))

Every field's default is the engine's own choice (None: worked out from the machine or the
model). Plain values only: no MLX here, so the app and the command line may build one
without loading anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from core.engine.turns import PrefillSharing
from core.engine.types import Speculation
from kvcache.kv_format import DEFAULT_GROUP_SIZE, KVFormat


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings. A bad KV format raises ValueError here, when it is made."""

    # the prefix cache (False: every prompt computed whole, nothing cached in RAM or on disk)
    use_cache: bool = True
    page_size: int | None = None  # tokens per KV page (None: the builder's default)
    pool_tokens: int | None = None  # the KV pool's size in tokens (None: from pool_bytes...)
    pool_bytes: int | None = None  # ... or in bytes (None: from the memory the device offers)
    pool_segment_bytes: int | None = None  # None: the builder's segments; 0: the pool at once
    # the disk cache: on or off, the data folder's budget (None: the default), and the
    # shortest unnamed request written to it (None: the disk tier's default)
    disk_cache: bool = True
    disk_budget_bytes: int | None = None
    disk_min_tokens: int | None = None
    kv_cache_path: Path | None = None  # the disk cache's database (None: the data folder's)
    # the KV format (kvcache.kv_format): bits (None: the model's precision), group size
    kv_bits: int | None = None
    kv_group_size: int | None = None
    chat_template: str | None = None  # Jinja text replacing the model's own template
    max_prompt_tokens: int | None = None  # None: the model's context is the limit
    speculation: Speculation = field(default_factory=Speculation)
    prefill_sharing: PrefillSharing = field(default_factory=PrefillSharing)

    def __post_init__(self) -> None:
        self.kv_format  # noqa: B018 (checked now: a bad format never reaches the engine thread)

    @property
    def kv_format(self) -> KVFormat:
        return KVFormat(self.kv_bits, self.kv_group_size or DEFAULT_GROUP_SIZE)
