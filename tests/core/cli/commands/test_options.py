"""The engine's configuration from the command line (``engine_config_of``): each command's
options, read once, into one :class:`EngineConfig`."""

from __future__ import annotations

import pytest

from core.cli.commands.options import engine_config_of
from core.cli.main import build_parser
from core.engine.config import EngineConfig
from core.engine.turns import PrefillSharing
from core.engine.types import Speculation
from core.errors import UserError


def config_of(*argv: str) -> EngineConfig:
    return engine_config_of(build_parser().parse_args(list(argv)))


def test_chat_options_make_the_engines_config(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    config = config_of(
        "chat",
        "--kv-tokens",
        "512",
        "--page-size",
        "32",
        "--no-cache",
        "--kv-bits",
        "8",
        "--kv-group-size",
        "32",
        "--max-prompt-tokens",
        "100",
        "--chat-template",
        str(template),
        "--speculative",
        "off",
    )
    assert config == EngineConfig(
        use_cache=False,
        page_size=32,
        pool_tokens=512,
        kv_bits=8,
        kv_group_size=32,
        chat_template=template.read_text(),
        max_prompt_tokens=100,
        speculation=Speculation("off"),
    )


def test_serve_options_set_the_waiting_cap_and_what_is_not_given_stays_the_default():
    assert config_of("serve", "--max-waiting", "3") == EngineConfig(
        prefill_sharing=PrefillSharing(max_waiting=3)
    )
    assert config_of("serve") == EngineConfig()
    assert config_of("serve", "--draft-model", "small").speculation == Speculation("draft", "small")


def test_a_missing_chat_template_is_a_user_error(tmp_path):
    with pytest.raises(UserError):
        config_of("serve", "--chat-template", str(tmp_path / "none.jinja"))
