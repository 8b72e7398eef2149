"""What the commands' parsers share: the data folder option, argument types, help lines."""

from __future__ import annotations

import argparse

MAX_PROMPT_HELP = (
    "refuse prompts longer than this many tokens, before any work on them "
    "(default: the model's context)"
)
MODEL_HELP = "known name, .gguf file, MLX folder or HF repo id (default: %(default)s)"
JSON_HELP = "print the result as one JSON object instead of text"
REPEATS_HELP = "repetitions (medians are reported; default: %(default)s)"


def add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", help="data folder (default: $RADIXCHAT_HOME or the platform's)"
    )


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
