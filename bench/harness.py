"""What the benchmarks share: their repetitions and the line that announces each, a scratch
data folder per run, dropping a file from the page cache, the filler text of their prompts,
the end of a request run on an engine, an OpenAI-style event stream read over a raw
connection, and the versions they report."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from core import paths
from core.engine.types import DoneEvent, Event, GenerationRequest, SamplingParams
from core.errors import UserError

TRAVEL_NOTES = (
    "The old town is best explored on foot early in the morning, before the tour buses arrive.",
    "Trams run every ten minutes until midnight; a day ticket pays for itself after three rides.",
    "The covered market sells cheese, bread and fruit; it is cheapest just before closing time.",
    "Restaurants near the main square are expensive; two streets away the same food costs half.",
)


def announce_repetition(bench: str, rep: int, repeats: int, detail: str = "") -> None:
    """``radixchat: bench NAME: repetition 2/3[, detail]`` on stderr, as repetition ``rep``
    (from 0) starts: what a bench that runs for minutes is doing."""
    print(
        f"radixchat: bench {bench}: repetition {rep + 1}/{repeats}"
        + (f", {detail}" if detail else ""),
        file=sys.stderr,
        flush=True,
    )


def repetitions(bench: str, repeats: int) -> Iterator[int]:
    """0, 1, ... ``repeats - 1``, each announced (:func:`announce_repetition`) as it starts."""
    for rep in range(repeats):
        announce_repetition(bench, rep, repeats)
        yield rep


@contextmanager
def scratch_data_folder(root: Path, bench: str) -> Iterator[Path]:
    """A fresh data folder under ``<root>/tmp`` (a cache that starts empty), removed with
    all it holds on leaving. It shares ``root``'s content-addressed caches (tokenizers,
    converted weights: linked, so nothing is rebuilt) and starts from its file hashes."""
    (root / "tmp").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"bench-{bench}-", dir=root / "tmp"))
    try:
        for shared in ("tokenizers", "converted"):
            if (root / shared).is_dir():
                (folder / shared).symlink_to((root / shared).resolve())
        if (root / "file_hashes.json").exists():
            shutil.copy(root / "file_hashes.json", folder / "file_hashes.json")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def drop_from_page_cache(*files: Path) -> bool:
    """fsync and advise the kernel to drop ``files`` from the page cache; False where the
    platform cannot (then "cold" reads are warm)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in files:
        if path.exists():
            fd = os.open(path, os.O_RDWR)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return True


def travel_notes(count: int) -> str:
    """``count`` lines of travel notes, a long prompt's filler (unnumbered: every line about
    the same size, so the prompt grows evenly with ``count``)."""
    return "\n".join(f"- {TRAVEL_NOTES[i % len(TRAVEL_NOTES)]}" for i in range(count))


def link_models(root: Path, data: Path) -> None:
    """The models of data folder ``root`` in a fresh one, ``data`` (its caches start empty)."""
    source = paths.models_dir(root)
    target = paths.models_dir(data)
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir() if source.exists() else ():
        if not (target / item.name).exists():
            (target / item.name).symlink_to(item)


def package_version(package: str) -> str | None:
    """The installed version of ``package`` (its metadata: nothing is imported); None if
    it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def final_event(events: Iterable[Event], bench: str) -> DoneEvent:
    """The :class:`DoneEvent` that ends a request's ``events`` (read to the end); a
    :class:`UserError` naming ``bench`` if the request ended any other way."""
    kept = deque(events, maxlen=1)  # run to the end, keep the last
    last = kept[0] if kept else None
    if not isinstance(last, DoneEvent):
        message = getattr(last, "message", "no reply from the engine")
        raise UserError(f"bench {bench}: a request failed: {message}")
    return last


def ask_greedy(
    engine, messages, bench: str, *, session=None, use_cache=True, max_tokens: int
) -> DoneEvent:
    """One greedy request of ``messages`` on an in-process engine, streamed to its end."""
    request = GenerationRequest(
        messages=tuple(messages),
        session=session,
        use_cache=use_cache,
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )
    return final_event(engine.stream(request), bench)


def chat_stream(
    conn: http.client.HTTPConnection, body: str, bench: str
) -> Iterator[tuple[float, dict]]:
    """POST ``body`` (JSON text, a streaming chat request) to ``/v1/chat/completions`` on
    ``conn``: :func:`event_stream`'s chunks."""
    return event_stream(conn, "/v1/chat/completions", body, bench)


def event_stream(
    conn: http.client.HTTPConnection, path: str, body: str, bench: str
) -> Iterator[tuple[float, dict]]:
    """POST ``body`` (JSON text, a streaming OpenAI request) to ``path`` on ``conn`` and yield
    each JSON chunk of the event stream with the ``time.perf_counter()`` at which its line
    arrived. The request is sent when the iteration starts. A :class:`UserError` naming
    ``bench`` for an answer other than 200 or an error chunk."""
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise UserError(
            f"bench {bench}: the server answered {response.status}: "
            f"{response.read().decode(errors='replace')[:200]}"
        )
    for line in response:
        now = time.perf_counter()
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise UserError(f"bench {bench}: the stream failed: {chunk['error'].get('message')}")
        yield now, chunk
