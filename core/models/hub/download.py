"""Download a model from the hub into the standard Hugging Face cache, resumably.

``pull("mlx-community/Qwen3-4B-4bit")`` fetches only what a model needs (client.plan picks
the files), into ``<HF cache>/models--org--name`` as huggingface_hub lays it out, so
mlx-lm and other tools see the same files, and nothing already there is fetched again.

How a file arrives: its bytes are read from the socket into a few reused buffers
(:mod:`core.models.hub.http_get`: huggingface_hub's own client hands them over in 64 KB
objects, which costs more CPU than the transfer) and appended to
``blobs/<etag>.incomplete`` (a ``Range`` request continues a partial file; a dropped
connection is retried from where it stopped), written and hashed on a second thread
while the next bytes arrive; a whole file whose SHA-256 (LFS files) or git blob id
(small files) matches what the hub listed becomes ``blobs/<etag>``. Only when every file
is there are they linked into ``snapshots/<commit>`` as huggingface_hub links them
(config.json last), so the model lists never see half a model. A cancel, a lost connection or a
killed app leaves the ``.incomplete`` file, and the next pull asks for the rest only
(huggingface_hub 2.x restarts such a file from zero, and its ``http_get`` gathers 10 MB
before it reports progress: too coarse for a cancel button, and slower).

Progress leaves through a callback of :class:`DownloadProgress` (bytes, rate, time left),
called from the download's threads; cancel with a ``threading.Event``.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import logging
import os
import queue
import shutil
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from core.models.hashing import FileHashCache
from core.models.hub import client, hf_cache, http_get
from core.models.hub.client import HubError, RepoFile, RepoPlan

log = logging.getLogger(__name__)

MAX_WORKERS = 4  # files fetched at once
PROGRESS_INTERVAL = 0.1  # seconds between progress callbacks
RATE_WINDOW = 5.0  # seconds the rate is averaged over
PARTIAL_SUFFIX = ".incomplete"
RETRIES = 5  # failed attempts in a row (no byte gained) before a file gives up
RETRY_WAIT = 0.5  # seconds between them
MIN_READ = 64 << 10  # bytes: the first read of a response, and the smallest
READ_SECONDS = 0.05  # what one read should take: reads grow or shrink towards it


class DownloadCancelled(HubError):
    """The user cancelled; what came so far is kept for the next pull."""


@dataclass(frozen=True)
class DownloadProgress:
    repo_id: str
    file: str  # the file that moved last
    done_bytes: int  # of the model's files, on disk (whole or partial)
    total_bytes: int
    fetched_bytes: int  # by this pull
    rate: float  # bytes per second over the last few seconds
    eta_seconds: float | None

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.total_bytes if self.total_bytes else 1.0


@dataclass(frozen=True)
class PullResult:
    spec: str  # what the loader takes: "org/name" or "org/name:file.gguf"
    path: Path  # the snapshot folder or GGUF file
    repo_id: str
    kind: str
    total_bytes: int
    fetched_bytes: int  # over the network, by this pull
    seconds: float


ProgressFn = Callable[[DownloadProgress], None]


def parse_target(target: str) -> tuple[str, str | None]:
    """``REPO[:FILE]`` -> ``(repo_id, file or None)``."""
    repo_id, sep, filename = (target or "").strip().partition(":")
    return repo_id, (filename if sep else None)


def pull(
    target: str,
    *,
    data_root: Path | None = None,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    revision: str = "main",
) -> PullResult:
    """Download ``REPO[:FILE]``; :class:`HubError` (one line) for anything the user can fix."""
    repo_id, filename = parse_target(target)
    return download(
        client.plan(repo_id, filename, revision),
        data_root=data_root,
        progress=progress,
        cancel=cancel,
        revision=revision,
    )


def partial_bytes(plan: RepoPlan) -> int:
    """Bytes of the plan's files already in the cache (whole, or partial from an earlier pull)."""
    done = 0
    for file in plan.files:
        blob, partial, pointer = _paths(plan, file)
        if pointer.is_file() or _regular_size(blob) is not None:
            done += file.size
        else:
            done += min(_regular_size(partial) or 0, file.size)
    return done


def download(
    plan: RepoPlan,
    *,
    data_root: Path | None = None,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    revision: str = "main",
) -> PullResult:
    started = time.monotonic()
    client.check_plan(plan)  # nothing the hub named leaves the repo's folders
    cancel = cancel or threading.Event()
    storage = hf_cache.repo_folder(plan.repo_id)
    assert storage is not None  # plan checked the repo id
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    todo: list[RepoFile] = []
    for file in plan.files:
        blob, partial, pointer = _paths(plan, file)
        if not (pointer.is_file() or _regular_size(blob) is not None):
            _clear_foreign(blob)
            _clear_foreign(partial)
            if (_regular_size(partial) or 0) > file.size:
                partial.unlink()  # not a prefix of this file
            todo.append(file)
    meter = _Meter(plan, partial_bytes(plan), progress, cancel)
    _check_disk_space(plan, todo, storage)
    hashes = FileHashCache.in_data_folder(data_root) if data_root is not None else None
    config = [f for f in todo if f.path == "config.json" and plan.architecture is None]
    try:
        if config:  # the hub did not say the model type: read it before the weights
            _fetch(plan, config[0], meter, hashes)
            _check_architecture(plan)
        rest = [f for f in todo if f not in config]
        if rest:
            _fetch_all(plan, rest, meter, hashes)
    except KeyboardInterrupt:
        raise DownloadCancelled(
            f"download of {plan.spec} cancelled ({meter.done / 1e6:,.0f} of "
            f"{meter.total / 1e6:,.0f} MB kept): pull it again to resume"
        ) from None
    meter.report(force=True)
    path = _link(plan, storage, revision)
    return PullResult(
        plan.spec,
        path,
        plan.repo_id,
        plan.kind,
        plan.size_bytes,
        meter.fetched,
        time.monotonic() - started,
    )


def _paths(plan: RepoPlan, file: RepoFile) -> tuple[Path, Path, Path]:
    storage = hf_cache.repo_folder(plan.repo_id)
    blob = storage / "blobs" / file.etag
    return (
        blob,
        blob.with_name(file.etag + PARTIAL_SUFFIX),
        storage / "snapshots" / plan.commit / file.path,
    )


def _check_disk_space(plan: RepoPlan, todo: list[RepoFile], storage: Path) -> None:
    needed = 0
    for file in todo:
        _, partial, _ = _paths(plan, file)
        needed += file.size - (_regular_size(partial) or 0)
    free = shutil.disk_usage(storage).free
    if needed > free:
        raise HubError(
            f"not enough disk space for {plan.spec}: it needs {needed / 1e9:.2f} GB more, "
            f"{free / 1e9:.2f} GB free in {storage.parent}"
        )


def _check_architecture(plan: RepoPlan) -> None:
    """When the hub did not say the model type: read the downloaded config.json."""
    import json

    config = next((f for f in plan.files if f.path == "config.json"), None)
    if config is None:
        return
    blob, _, _ = _paths(plan, config)
    try:
        model_type = json.loads(blob.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        raise HubError(
            f"{plan.repo_id}'s config.json is not valid JSON: not a model RadixChat can load"
        ) from None
    if not model_type or not client.mlx_lm_supports(str(model_type)):
        raise HubError(
            f"{plan.repo_id} is a {model_type or 'untyped'} model, which mlx-lm can't load"
        )


def _fetch_all(plan: RepoPlan, files: list[RepoFile], meter: _Meter, hashes) -> None:
    with ThreadPoolExecutor(
        max_workers=min(MAX_WORKERS, len(files)), thread_name_prefix="pull"
    ) as pool:
        # The largest first: it takes longest, so it starts before the small ones take the
        # GIL to open their requests (MAX_WORKERS at once; the rest as workers free up).
        futures = [
            pool.submit(_fetch, plan, f, meter, hashes)
            for f in sorted(files, key=lambda f: -f.size)
        ]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        except KeyboardInterrupt:
            meter.stop.set()
            wait(futures)
            raise
        errors = [f.exception() for f in done if f.exception() is not None]
        if errors:
            meter.stop.set()  # the other files stop at their next chunk
            wait(futures)
            cancelled = [e for e in errors if isinstance(e, DownloadCancelled)]
            raise (
                errors[0]
                if not cancelled or len(cancelled) == len(errors)
                else next(e for e in errors if not isinstance(e, DownloadCancelled))
            )


def _fetch(plan: RepoPlan, file: RepoFile, meter: _Meter, hashes: FileHashCache | None) -> None:
    """One file into ``blobs/<etag>``, resuming its ``.incomplete`` part, verified."""
    blob, partial, _ = _paths(plan, file)
    # The commit's URL names these bytes for good; the hub redirects it to its CDN, and
    # the HTTP client drops the token on a redirect to another host.
    url = client.file_url(plan.repo_id, file.path, plan.commit)
    try:
        headers = client.request_headers()
        with _open_partial(partial) as raw:  # unbuffered: the buffers are large, no second copy
            sink = _Sink(raw, file)
            try:
                _transfer(url, headers, file, sink, meter)
                digest = sink.finish()
            finally:
                sink.close()
            written = os.fstat(raw.fileno())
    except (DownloadCancelled, HubError):
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise HubError(
                f"the disk is full: {file.path} of {plan.repo_id} stopped at "
                f"{_size(partial) / 1e6:,.0f} MB (kept); free some space and pull again"
            ) from None
        raise client.hub_error(exc, plan.repo_id) from None
    except Exception as exc:
        raise client.hub_error(exc, plan.repo_id) from None
    expected = file.sha256 or file.blob_id
    if digest != expected:
        partial.unlink(missing_ok=True)
        kind = "SHA-256" if file.sha256 else "git blob id"
        raise HubError(
            f"{file.path} of {plan.repo_id} failed its hash check ({kind} {digest[:12]}…, the "
            f"hub lists {expected[:12]}…): the file was deleted; pull again"
        )
    try:
        now = os.lstat(partial)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (written.st_dev, written.st_ino):
        raise HubError(
            f"{file.path} of {plan.repo_id}: its part file {partial.name} was replaced while it "
            "downloaded; pull again"
        )
    _clear_foreign(blob)
    os.replace(partial, blob)
    if hashes is not None and file.sha256:
        hashes.remember(blob, digest)  # the model's fingerprint will not hash it again


def _transfer(url: str, headers: dict, file: RepoFile, sink: _Sink, meter: _Meter) -> None:
    """Stream the rest of ``file`` into ``sink``; a dropped connection is asked again
    from where it stopped (up to ``RETRIES`` times in a row without progress)."""
    from huggingface_hub import constants

    failures = 0
    while sink.position < file.size:
        start = sink.position
        request = {**headers, **({"Range": f"bytes={start}-"} if start else {})}
        try:
            with http_get.open_get(
                url, request, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT
            ) as response:
                if start and response.status == 200:  # the server ignored the Range
                    sink.restart()
                    meter.update(file, -start)
                    start = 0
                if response.length is not None and start + response.length > file.size:
                    raise HubError(
                        f"{file.path} came longer than the {file.size:,} bytes the hub lists: "
                        "pull again"
                    )
                _receive(response, file, sink, meter)
        except _retryable() as exc:
            failures = 0 if sink.position > start else failures + 1
            if failures >= RETRIES or meter.cancel.is_set():
                meter.update(file, 0)  # a cancel says so rather than the network error
                raise
            log.warning(
                "%s: %s after %d bytes; asking for the rest",
                file.path,
                type(exc).__name__,
                sink.position,
            )
            time.sleep(RETRY_WAIT)
            continue
        if sink.position < file.size:  # the server closed early without an error
            failures = 0 if sink.position > start else failures + 1
            if failures >= RETRIES:
                raise HubError(
                    f"{file.path} stopped at {sink.position:,} of {file.size:,} bytes: pull again"
                )


def _receive(response, file: RepoFile, sink: _Sink, meter: _Meter) -> None:
    """Read the body into the sink's buffers until it ends (or the file is whole).

    Each read fills one reused buffer straight from the socket (no ``bytes`` object per
    chunk); its size adapts to the link, from ``MIN_READ`` up to a whole buffer, so that
    a read takes about ``READ_SECONDS``: a slow link still reports progress and sees a
    cancel several times a second."""
    size = MIN_READ
    while True:
        buffer = sink.buffer()
        # one byte more shows a body too long
        want = min(size, len(buffer), file.size + 1 - sink.position)
        started = time.monotonic()
        try:
            n = response.readinto(memoryview(buffer)[:want])
        except BaseException:
            sink.give_back(buffer)
            raise
        if not n:
            sink.give_back(buffer)
            return
        if sink.position + n > file.size:
            sink.give_back(buffer)
            raise HubError(
                f"{file.path} came longer than the {file.size:,} bytes the hub lists: pull again"
            )
        sink.write(buffer, n)
        meter.update(file, n)  # raises when cancelled
        if n == want:
            took = time.monotonic() - started
            if took < READ_SECONDS / 2:
                size = min(size * 2, len(buffer))
            elif took > READ_SECONDS * 2:
                size = max(size // 2, MIN_READ)
        if sink.position == file.size:
            return


def _retryable() -> tuple[type[BaseException], ...]:
    return http_get.network_errors()


def _size(path: Path) -> int:
    return _regular_size(path) or 0


def _regular_size(path: Path) -> int | None:
    """The size of ``path`` if it is a regular file itself (not a symlink to one: a link is
    never taken for a download's own file), else None."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _clear_foreign(path: Path) -> None:
    """Remove what is at ``path`` unless it is a regular file: a symlink (never written
    through: a resumed download would append to whatever it points at), a folder (which
    would fail every pull), anything else. The link itself goes, never its target."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(info.st_mode):
        return
    log.warning("%s is not a regular file (a link or a folder): replaced", path)
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def _open_partial(path: Path):
    """``path`` opened to append and read back, as a regular file of its own: a symlink or
    folder put there since :func:`_clear_foreign` is refused (``O_NOFOLLOW``), never
    written through."""
    _clear_foreign(path)
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, "not a regular file", str(path))
        return os.fdopen(fd, "a+b", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def _write_new(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as a new file of its own (whatever was there removed first;
    never through a link)."""
    _remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def _remove(path: Path) -> None:
    """Remove whatever is at ``path`` (a file, a link, a folder); nothing if there is nothing."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def _link(plan: RepoPlan, storage: Path, revision: str) -> Path:
    """Link the verified blobs into ``snapshots/<commit>`` as huggingface_hub links them (a
    relative symlink to ``../../blobs/<etag>``; a copy where the file system has no
    symlinks), ``config.json`` last, then ``refs/<revision>``. No request: every blob was
    checked against the hash the hub listed for this commit (``hf_hub_download`` would ask
    the hub again with a HEAD per file only to find the blob in place)."""
    snapshot = storage / "snapshots" / plan.commit
    missing = [f for f in plan.files if not (snapshot / f.path).is_file()]
    # sorted() keeps the order otherwise
    for file in sorted(missing, key=lambda f: f.path == "config.json"):
        blob, _, pointer = _paths(plan, file)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        tmp = pointer.with_name(f".{pointer.name}.{os.getpid()}.tmp")
        _remove(tmp)
        try:
            os.symlink(os.path.relpath(blob, pointer.parent), tmp)
        except OSError:  # no symlinks here (Windows without the right): as huggingface_hub, a copy
            shutil.copyfile(blob, tmp)
        os.replace(tmp, pointer)
    if revision != plan.commit:
        ref = storage / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
        _write_new(tmp, plan.commit)
        tmp.replace(ref)
    return snapshot / plan.files[0].path if plan.kind == "gguf" else snapshot


class _Sink:
    """Where a file's bytes go: appended to the partial file and hashed as the hub names
    the file (SHA-256 for an LFS file, the git blob SHA-1 otherwise), the part already
    there first. The reading side fills one of ``BUFFERS`` reused buffers from the
    socket and hands it on: a thread hashes it, a second one appends it to the file and
    gives the buffer back (hashing and writing both let go of the GIL), so reading,
    hashing and writing overlap, and no chunk is copied or allocated in Python.
    ``position`` counts the bytes taken."""

    BUFFERS = 4
    # measured: larger buffers fall out of the CPU's cache between the stages
    BUFFER_BYTES = 1 << 20

    def __init__(self, raw, file: RepoFile):
        self._raw, self._file = raw, file
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(self.BUFFERS):
            # a small file needs no more (the one byte over shows a body longer than listed)
            self._free.put(bytearray(min(self.BUFFER_BYTES, file.size + 1)))
        self._to_hash: queue.Queue = queue.Queue()
        self._to_write: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._rehash()
        self._threads = [
            threading.Thread(target=self._hashing, name="pull-hash", daemon=True),
            threading.Thread(target=self._writing, name="pull-write", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _rehash(self) -> None:
        self._hasher = (
            hashlib.sha256() if self._file.sha256 else hashlib.sha1(b"blob %d\0" % self._file.size)
        )
        self.position = self._raw.seek(0, os.SEEK_END)
        offset = 0  # the part already there, read through the same descriptor (not by name)
        while chunk := os.pread(self._raw.fileno(), 8 << 20, offset):
            self._hasher.update(chunk)
            offset += len(chunk)

    def _hashing(self) -> None:
        while True:
            item = self._to_hash.get()
            try:
                if item is not None and self._error is None:
                    buffer, n = item
                    with memoryview(buffer) as view, view[:n] as data:
                        self._hasher.update(data)
            except BaseException as exc:  # not expected: the reading side raises it
                self._error = exc
            finally:
                self._to_write.put(item)  # the writer gives the buffer back
                self._to_hash.task_done()
            if item is None:
                return

    def _writing(self) -> None:
        while True:
            item = self._to_write.get()
            try:
                if item is None:
                    return
                buffer, n = item
                try:
                    if self._error is None:
                        with memoryview(buffer) as view, view[:n] as data:
                            self._put(data)
                finally:
                    self._free.put(buffer)
            except BaseException as exc:  # a full disk: the reading side raises it
                self._error = exc
            finally:
                self._to_write.task_done()

    def _put(self, data: memoryview) -> None:
        while data:  # an unbuffered file may take part of a write
            data = data[self._raw.write(data) :]

    def _drain(self) -> None:
        self._to_hash.join()
        self._to_write.join()
        if self._error is not None:
            raise self._error

    def buffer(self) -> bytearray:
        """A free buffer to read into (waits while all are being written)."""
        if self._error is not None:
            raise self._error
        return self._free.get()

    def give_back(self, buffer: bytearray) -> None:
        self._free.put(buffer)

    def write(self, buffer: bytearray, n: int) -> None:
        """Append ``buffer[:n]``; the buffer is the sink's again until :meth:`buffer` returns it."""
        self._to_hash.put((buffer, n))
        self.position += n

    def restart(self) -> None:
        """The server ignored the Range: start the file again."""
        self._drain()
        self._raw.truncate(0)
        self._raw.seek(0)
        self._rehash()

    def finish(self) -> str:
        self._drain()
        self._raw.flush()
        return self._hasher.hexdigest()

    def close(self) -> None:
        try:
            self._to_hash.join()  # keep what arrived: a resume starts after it
            self._to_write.join()
        finally:
            self._to_hash.put(None)
            for thread in self._threads:
                thread.join()
            self._raw.flush()


class _Meter:
    """Bytes across the files of one pull: rate, time left, progress callbacks, cancel."""

    def __init__(
        self, plan: RepoPlan, done: int, progress: ProgressFn | None, cancel: threading.Event
    ):
        self.plan, self.total, self.done, self.fetched = plan, plan.size_bytes, done, 0
        self._progress, self.cancel, self.stop = progress, cancel, threading.Event()
        self._lock = threading.Lock()
        self._samples: collections.deque[tuple[float, int]] = collections.deque(
            [(time.monotonic(), 0)]
        )
        self._last_report = 0.0
        self._file = ""

    def update(self, file: RepoFile, n: int) -> None:
        if self.cancel.is_set() or self.stop.is_set():
            raise DownloadCancelled(
                f"download of {self.plan.spec} cancelled ({self.done / 1e6:,.0f} of "
                f"{self.total / 1e6:,.0f} MB kept): pull it again to resume"
            )
        with self._lock:
            self.done += n
            self.fetched += n
            self._file = file.path
        self.report()

    def report(self, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last_report < PROGRESS_INTERVAL:
                return
            self._last_report = now
            self._samples.append((now, self.fetched))
            while len(self._samples) > 2 and now - self._samples[1][0] > RATE_WINDOW:
                self._samples.popleft()
            t0, f0 = self._samples[0]
            rate = (self.fetched - f0) / (now - t0) if now > t0 else 0.0
            left = max(0, self.total - self.done)
            update = DownloadProgress(
                self.plan.spec,
                self._file,
                min(self.done, self.total),
                self.total,
                self.fetched,
                rate,
                left / rate if rate > 0 else (0.0 if not left else None),
            )
        if self._progress is not None:
            self._progress(update)
