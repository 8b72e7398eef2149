"""Session caches to and from the disk store.

Saving happens at the end of a session's turn: the engine thread cuts the session's
tokens into disk pages, serializes only pages the store does not have yet (the rest go
as ``kv=None``) and hands plain bytes to a writer thread, which owns its own
:class:`DiskStore` connection; decode never waits on disk. Restoring happens when a
session's request finds less in RAM than the store holds: the engine thread reads that
session's chain (primary-key lookups only), keeps the part that matches the prompt, and
puts it into the pool and the tree. Every page is verified by the store (checksum,
fingerprint, key); a damaged page costs a recompute, never a wrong answer.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from kvcache.prefix_cache import PrefixCache
from kvcache.serialize import SerializeError, kv_to_bytes, kv_views, snapshot_from_bytes, snapshot_to_bytes
from kvcache.snapshot import Snapshot
from kvcache.store import (DEFAULT_BUDGET, ChainPage, DiskStore, DiskStoreError, PageData, SessionReader,
                           chain_keys, page_key)

log = logging.getLogger(__name__)

DISK_PAGE_TOKENS = 64  # tokens per stored page: fewer rows than pool pages, same bytes


@dataclass(frozen=True)
class _SaveJob:
    session: str
    pages: tuple[PageData, ...]


@dataclass(frozen=True)
class _ForgetJob:
    session: str


@dataclass(frozen=True)
class _RecordJob:
    """A restore's reading to record: pages used, pages found bad."""

    session: str
    used: tuple[ChainPage, ...]
    suspects: frozenset[str]


class SessionPersister:
    """Saves and restores session caches for one loaded model (engine thread API)."""

    def __init__(self, path: Path, prefix_cache: PrefixCache, fingerprint: str,
                 budget_bytes: int = DEFAULT_BUDGET):
        self.prefix_cache = prefix_cache
        self.fingerprint = fingerprint
        self.reader = DiskStore(path, budget_bytes=budget_bytes)  # raises DiskStoreError
        self._writer = DiskStore(path, budget_bytes=budget_bytes)
        self._jobs: queue.Queue = queue.Queue()
        self._known: set[str] = set()  # page keys this process knows the store holds
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._write_loop, name="radixchat-cache-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ engine thread
    def save(self, session: str, tokens: list[int], caches: list, snapshots: list[Snapshot]) -> None:
        """Queue the session's cache (``caches`` hold exactly ``tokens``) for writing.

        Pages end every ``DISK_PAGE_TOKENS`` tokens and at every snapshot (the end of the
        prompt, the end of the reply), and carry the snapshot that ends with them, so a
        hybrid model can resume from any of those points after a restart.
        """
        by_end = {s.length: s for s in snapshots if 0 < s.length <= len(tokens)}
        if self.prefix_cache.hybrid and len(tokens) not in by_end:
            return  # a hybrid chain must be resumable at least at its end
        full = self.prefix_cache.build.layout.full_layer_indices
        ends = sorted(set(range(DISK_PAGE_TOKENS, len(tokens), DISK_PAGE_TOKENS)) | set(by_end) | {len(tokens)})
        pages, parent, start = [], None, 0
        for end in ends:
            chunk = tuple(tokens[start:end])
            key = page_key(self.fingerprint, parent, chunk)
            snapshot = by_end.get(end)
            if key in self._known and snapshot is None:
                pages.append(PageData(chunk, None))
            else:
                kv = kv_to_bytes([(caches[i].keys[0, :, start:end], caches[i].values[0, :, start:end])
                                  for i in full])
                pages.append(PageData(chunk, kv, snapshot_to_bytes(snapshot) if snapshot else None))
            parent, start = key, end
        self._jobs.put(_SaveJob(session, tuple(pages)))  # keys become known once written

    def restore(self, session: str, prompt: list[int]) -> int:
        """Bring the session's stored cache into RAM if it serves more of ``prompt``
        than RAM does. Returns the tokens restored (0 when nothing was needed or usable).
        Any failure here costs a recompute, never the request."""
        try:
            return self._restore(session, prompt)
        except (DiskStoreError, SerializeError, ValueError, AttributeError, KeyError) as exc:
            self.last_error = str(exc)
            log.warning("restoring the cache of %s failed: %s", session, exc)
            return 0

    def _restore(self, session: str, prompt: list[int]) -> int:
        usable_limit = len(prompt) - 1  # the last prompt token is always computed
        in_ram = self.prefix_cache.cached_length(prompt[:usable_limit])
        stored = self.reader.session(session)
        if stored is None or stored.fingerprint != self.fingerprint or stored.tokens <= in_ram:
            return 0
        reading = None
        try:
            with self.reader.read_session(session, self.fingerprint, record=False) as reading:
                best = _resume_point(reading.chain, prompt, usable_limit, self.prefix_cache.hybrid)
                if best <= in_ram:
                    return 0
                if -(-best // self.prefix_cache.page_size) > self.prefix_cache.allocator.num_pages:
                    return 0  # the pool can never hold it: don't read it only to drop it
                return self._insert(prompt[:best], reading, in_ram, room=len(prompt) - best + 1)
        finally:  # marking pages used takes the write lock: the writer thread waits for it
            if reading is not None and (reading.used or reading.suspects):
                self._jobs.put(_RecordJob(session, tuple(reading.used), frozenset(reading.suspects)))

    def _insert(self, tokens: list[int], reading: SessionReader, start: int, room: int = 0) -> int:
        """Restore ``tokens[start:]`` from the session being read, streaming its pages. The
        K/V of each layer is joined into one buffer with ``room`` spare positions (rounded
        up to mlx-lm's KVCache step), so a request resuming from it prefills in place (see
        ``insert_restored``). A page that fails its check ends the stream: what came before
        it (back to a snapshot, for a hybrid model) is restored, the rest is recomputed."""
        layers = len(self.prefix_cache.build.layout.full_layer_indices)
        spare = KVCache.step * -(-(len(tokens) + max(room, 1)) // KVCache.step) - len(tokens)
        joined = _Joiner(2 * layers, len(tokens) - start + spare)
        count = offset = 0
        while offset < len(tokens):
            offset += len(reading.chain[count].tokens)
            count += 1
        offset, snapshots = 0, {}
        for page in reading.pages(count):
            take = min(len(page.tokens), len(tokens) - offset)
            if offset + take > start and layers:
                lo = max(0, start - offset)
                joined.add(offset + lo - start, take - lo, lo, kv_views(page.kv, layers, len(page.tokens)))
            if page.snapshot is not None and offset + len(page.tokens) <= len(tokens):
                snapshots[offset + len(page.tokens)] = page.snapshot
            offset += take
        end = max(snapshots, default=0) if self.prefix_cache.hybrid else offset
        if end <= start:
            return 0
        snapshot = snapshot_from_bytes(snapshots[end]) if end in snapshots else None
        restored = self.prefix_cache.insert_restored(tokens[:end], start, joined.layers(), snapshot)
        if restored:
            self._known.update(page.key for page in reading.used)
        return restored

    def forget(self, session: str) -> None:
        """Queue the removal of ``session``'s cache from disk (the chat was deleted); pages
        that other sessions share stay."""
        self._jobs.put(_ForgetJob(session))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued save is written (tests, shutdown)."""
        done = threading.Event()
        self._jobs.put(done)
        done.wait(timeout)

    def close(self) -> None:
        self.flush(timeout=30)
        self._jobs.put(None)
        self._thread.join(timeout=30)  # the writer's connection closes first: the last one
        self.reader.close()  # to close checkpoints the log into the file

    # ------------------------------------------------------------ writer thread
    def _write_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                self._writer.close()
                return
            if isinstance(job, threading.Event):
                job.set()
                continue
            if isinstance(job, _RecordJob):
                try:
                    self._writer.record_reading(job.session, self.fingerprint, job.used, set(job.suspects))
                except Exception as exc:  # last-use times and repairs wait for the next read
                    log.warning("recording the restore of %s failed: %s", job.session, exc)
                if job.suspects:
                    self._forget_missing()  # the repair deleted pages
                continue
            if isinstance(job, _ForgetJob):
                try:
                    self._writer.clear(job.session)
                except Exception as exc:  # as for a save: the writer thread must go on
                    self.last_error = str(exc)
                    log.warning("removing the cache of %s failed: %s", job.session, exc)
                self._forget_missing()  # its pages may be gone
                continue
            try:
                result = self._writer.save_session(job.session, self.fingerprint, job.pages)
                self._known.update(chain_keys(self.fingerprint, [p.tokens for p in job.pages]))
                if result.evicted_sessions or result.pages < len(job.pages):
                    self._forget_missing()  # the budget (or another process) deleted pages
            except DiskStoreError as exc:  # disk full, locked...: the cache costs time, no more
                self.last_error = str(exc)
                self._known.clear()
                log.warning("saving the cache of %s failed: %s", job.session, exc)
            except Exception:
                self._known.clear()
                log.exception("saving the cache of %s failed", job.session)


    def _forget_missing(self) -> None:
        """Writer thread: drop from ``_known`` the pages the store no longer has, so the
        next save serializes those again (and only those: a save that evicts an old
        session must not make every later save serialize its whole chat anew)."""
        try:
            self._known.difference_update(self._writer.missing_keys(list(self._known)))
        except Exception as exc:  # cannot tell: assume nothing is stored
            log.warning("checking which cached pages are on disk failed: %s", exc)
            self._known.clear()


class _Joiner:
    """Each layer's K and V, joined along the tokens into one zeroed ``(heads, length, dim)``
    MLX buffer (the tail is spare room), page by page as a restore streams them.

    Pages are copied straight into the evaluated MLX buffers through numpy views (an MLX
    array exposes its memory, and these are referenced nowhere else yet): one copy into
    memory touched once, while the store reads the next pages."""

    def __init__(self, arrays: int, length: int):
        self.arrays, self.length = arrays, length
        self.buffers: list[mx.array] = []
        self.names: list[str] = []
        self.targets: list[np.ndarray] = []

    def add(self, at: int, n: int, lo: int, views: list) -> None:
        """Tokens ``lo..lo+n-1`` of a page (its K/V views, every layer) go to ``at..at+n-1``."""
        if not self.buffers:
            for name, first in views[: self.arrays]:
                dtype = mx.uint16 if name == "bfloat16" else getattr(mx, name)  # bfloat16: its bits
                self.buffers.append(mx.zeros((first.shape[0], self.length, first.shape[2]), dtype=dtype))
                self.names.append(name)
            mx.eval(self.buffers)
            self.targets = [np.array(buffer, copy=False) for buffer in self.buffers]  # views
        for target, (_, view) in zip(self.targets, views):
            target[:, at : at + n] = view[:, lo : lo + n]

    def layers(self) -> list[tuple[mx.array, mx.array]]:
        """``(keys, values)`` per layer; [] when nothing was added."""
        self.targets = []
        joined = [b.view(mx.bfloat16) if name == "bfloat16" else b for b, name in zip(self.buffers, self.names)]
        return list(zip(joined[0::2], joined[1::2]))


def _resume_point(chain: list[ChainPage], prompt: list[int], limit: int, hybrid: bool) -> int:
    """How much of ``prompt`` (at most ``limit`` tokens) the stored chain can serve: its
    longest common prefix, cut back to a page end with a snapshot for a hybrid model."""
    matched = best = 0
    ends = []
    for page in chain:
        n = len(page.tokens)
        if tuple(prompt[matched : matched + n]) != page.tokens:
            if not hybrid:  # token-exact: part of this page still counts
                best = matched + _common(page.tokens, prompt[matched:])
            break
        matched += n
        if page.has_snapshot:
            ends.append(matched)
        if not hybrid:
            best = matched
    if hybrid:
        return max((end for end in ends if end <= limit), default=0)
    return min(best, limit)


def _common(a: tuple[int, ...], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
