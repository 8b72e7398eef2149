"""What the commands' parsers share: the data folder option, argument types, help lines."""

from __future__ import annotations

import argparse
import math

from core.errors import UserError
from core.limits import MAX_WAITING_PER_KEY, SPECULATIVE_MODES

MAX_PROMPT_HELP = (
    "refuse prompts longer than this many tokens, before any work on them "
    "(default: the model's context)"
)
MODEL_HELP = "known name, .gguf file, MLX folder or HF repo id (default: %(default)s)"
JSON_HELP = "print the result as one JSON object instead of text"
REPEATS_HELP = "repetitions (medians are reported; default: %(default)s)"


def add_data_dir(parser: argparse.ArgumentParser, *, top_level: bool = False) -> None:
    """``--data-dir``, on the top level (default None) or on a command. Given before the
    command (``radixchat --data-dir X chats import F``) the top level's value stands: a
    command's own default is SUPPRESS, not None, so it never writes over it."""
    parser.add_argument(
        "--data-dir",
        default=None if top_level else argparse.SUPPRESS,
        help="data folder (default: $RADIXCHAT_HOME or the platform's)",
    )


def add_speculation(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--speculative",
        choices=SPECULATIVE_MODES,
        help="speculative decoding: off; ngram (drafts from the prompt, the reply so far and "
        "the cache; the default); draft (--draft-model's). A request may choose its own",
    )
    parser.add_argument(
        "--draft-model",
        metavar="MODEL",
        help="a small model with the same tokenizer that drafts tokens for the model to check "
        "(as mlx-lm's --draft-model); implies --speculative draft",
    )


def speculation_of(args: argparse.Namespace):
    """The engine's speculative decoding (a :class:`core.engine.types.Speculation`) from
    ``--speculative`` and ``--draft-model``."""
    from core.engine.types import Speculation

    draft = getattr(args, "draft_model", None)
    mode = getattr(args, "speculative", None) or ("draft" if draft else "ngram")
    try:
        return Speculation(mode, draft)
    except ValueError as exc:
        raise UserError(f"--speculative {mode}: {exc}") from None


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0 to 65535)")
    return value


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def disk_gb(text: str) -> float:
    """A disk budget in GB (``core.paths.GB``: 2**30 bytes), at least 1 MB."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in GB") from None
    if not 1 / 1024 <= value < math.inf:  # NaN too
        raise argparse.ArgumentTypeError(f"{text} GB is not a disk budget (1 MB at least: 0.001)")
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is a negative number")
    return value


# the KV formats (kvcache.kv_format: BITS, GROUP_SIZES; not imported, to keep the table light)
KV_BITS, KV_GROUP_SIZES = (8, 4), (32, 64, 128)


def add_kv_format(parser: argparse.ArgumentParser) -> None:
    """``--kv-bits`` and ``--kv-group-size``: how cached keys and values are stored."""
    parser.add_argument(
        "--kv-bits",
        type=int,
        choices=KV_BITS,
        help="store cached K/V quantized to this many bits (MLX affine quantization, as "
        "mlx-lm's QuantizedKVCache): about 2x (8) or 4x (4) the tokens in the same RAM and "
        "disk (default: the model's precision; sliding-window and recurrent layers keep theirs)",
    )
    parser.add_argument(
        "--kv-group-size",
        type=int,
        choices=KV_GROUP_SIZES,
        help="values per quantization group, with --kv-bits (default: 64)",
    )


def engine_config_of(args: argparse.Namespace):
    """The engine's configuration (a :class:`core.engine.config.EngineConfig`) from the
    options a command has: ``--kv-tokens``, ``--page-size``, ``--no-cache``,
    ``--chat-template`` (the file read now: a bad one is a UserError), ``--max-prompt-tokens``,
    ``--max-waiting``, ``--speculative``/``--draft-model``, ``--kv-bits``/``--kv-group-size``,
    ``--disk-budget`` (GB). An option the command lacks, or one not given, leaves the
    engine's default."""
    from core.engine.config import EngineConfig
    from core.engine.turns import PrefillSharing
    from core.models.load.chat_template import read_chat_template
    from core.paths import gb_to_bytes

    template = getattr(args, "chat_template", None)
    disk_budget = getattr(args, "disk_budget", None)
    return EngineConfig(
        use_cache=not getattr(args, "no_cache", False),
        page_size=getattr(args, "page_size", None),
        pool_tokens=getattr(args, "kv_tokens", None),
        disk_budget_bytes=None if disk_budget is None else gb_to_bytes(disk_budget),
        kv_bits=getattr(args, "kv_bits", None),
        kv_group_size=getattr(args, "kv_group_size", None),
        chat_template=read_chat_template(template) if template else None,
        max_prompt_tokens=getattr(args, "max_prompt_tokens", None),
        speculation=speculation_of(args),
        prefill_sharing=PrefillSharing(getattr(args, "max_waiting", None) or MAX_WAITING_PER_KEY),
    )
