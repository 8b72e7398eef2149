"""Base models: a model whose files carry no chat template, or whose name marks it as a
base model, continues text rather than chatting. RadixChat labels it
"base: completion only" (the picker, ``radixchat models``, ``/v1/models``, the window) and
still serves chat requests on it with a fallback template.

Decided from the files, without loading weights: a GGUF file's header (only
``tokenizer.chat_template``, ``general.name`` and ``general.finetune`` are decoded), an MLX
folder's ``chat_template.jinja`` / ``chat_template.json`` or the ``chat_template`` of its
``tokenizer_config.json``. A name marks a base model when it has the word "base"
(``Qwen3-0.6B-Base``, ``granite-3.0-2b-base``): such a model may ship a template it was
never trained to follow. The answer is remembered by path, size and modification time.
Plain file reads (no mlx), for the GUI and the command line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

BASE_LABEL = "base: completion only"
TEMPLATE_KEY = "tokenizer.chat_template"
NAME_KEYS = ("general.name", "general.finetune")
GGUF_KEYS = (TEMPLATE_KEY, *NAME_KEYS)  # what to decode of a header (``read_header(path, keys)``)
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
_BASE_WORD = re.compile(r"(?<![a-z0-9])base(?![a-z0-9])", re.IGNORECASE)


def named_base(name: object) -> bool:
    """Whether a model's name marks it as a base model (the word "base" in it)."""
    return isinstance(name, str) and _BASE_WORD.search(name) is not None


def gguf_metadata_is_base(metadata: Mapping[str, object]) -> bool:
    """A GGUF file's metadata: no chat template, or a name that says "base"."""
    return not metadata.get(TEMPLATE_KEY) or any(named_base(metadata.get(k)) for k in NAME_KEYS)


def is_base_model(path: Path, name: str | None = None) -> bool:
    """Whether the ``.gguf`` file or MLX folder at ``path`` is a base model. ``name``: what
    the model is called (default: the file's stem, the folder's name; give a hub snapshot's
    repo id), checked for the word "base" beside the names inside the file. False for what
    cannot be read: loading it says what is wrong."""
    path = Path(path)
    if name is None and not _is_snapshot(path):
        name = path.stem if path.suffix.lower() == ".gguf" else path.name
    try:
        if path.is_dir():
            stamps = tuple(_stamp(path / file) for file in TEMPLATE_FILES)
            found = _folder_is_base(str(path), stamps)
        elif path.suffix.lower() == ".gguf":
            found = _gguf_is_base(str(path), *_stamp(path))
        else:
            return False
    except OSError:
        return False
    return found or named_base(name)


def _stamp(path: Path) -> tuple[int, int]:
    """(size, mtime) of a file, (-1, -1) when it is not there: the cache's key."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return -1, -1
    return st.st_size, st.st_mtime_ns


@lru_cache(maxsize=256)
def _gguf_is_base(path: str, size: int, mtime_ns: int) -> bool:
    """(size and mtime are the cache key: a changed file is read again)"""
    from core.errors import ModelLoadError
    from core.models.load.gguf_header import read_header  # numpy and gguf: only when asked

    try:
        header = read_header(Path(path), metadata=GGUF_KEYS)
    except ModelLoadError:
        return False
    return gguf_metadata_is_base(header.metadata)


@lru_cache(maxsize=256)
def _folder_is_base(folder: str, stamps: tuple[tuple[int, int], ...]) -> bool:
    """(the stamps of the template files are the cache key)"""
    root = Path(folder)
    if (root / "chat_template.jinja").is_file():
        return False
    for file in ("chat_template.json", "tokenizer_config.json"):
        try:
            config = json.loads((root / file).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and config.get("chat_template"):
            return False
    return True


def _is_snapshot(folder: Path) -> bool:
    """A Hugging Face cache snapshot (named by a commit id: its repo's name is the name)."""
    return folder.parent.name == "snapshots"
