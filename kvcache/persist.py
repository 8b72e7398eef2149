"""The disk tier: the SQLite page store below the RAM radix tree, for every request.

A request's prompt is looked up in RAM, then on disk by its own tokens: the loaded
model's stored pages are indexed in memory (:class:`kvcache.disk_index.DiskIndex`), so a
prompt the disk knows nothing of costs no query. What the disk holds beyond what RAM
holds is read back (streamed, every page verified by the store) when the measured read
rate says that is faster than the measured prefill rate would compute it.

What is written, and when (never on the engine thread's critical path: the engine
serializes only pages the store does not have, after the request's reply has ended
(:meth:`DiskTier.serialize_pending`), and a writer thread owns its own
:class:`DiskStore` connection):
- at the end of a session's turn, the session's chain (a chat's cache survives a restart);
- at the end of any other request whose tokens reach ``min_write_tokens``, its chain as a
  prefix (kept by its tokens alone);
- when RAM evicts a prefix of at least one disk page that the disk lacks (write-back:
  short requests, or any whose end-of-request write was skipped), so that RAM pressure
  costs a read later instead of a recompute;
- a page already stored is never serialized nor written again; the bytes written are
  counted (:class:`DiskTierStats`, and the store's own counters);
- a page handed to the writer is indexed at once and read from memory until the writer
  has written it (:mod:`kvcache.unwritten`): the writer runs at nice 19 and may lag far
  behind on a busy machine, which must cost the disk time, never a restore.
A full disk stops the writes (one line in the log and in the stats) and serving goes on;
writing is tried again after ``RETRY_AFTER_S``. Every page read is verified (checksum,
fingerprint, key): a damaged page costs a recompute, never a wrong answer.

Every call names the request's cache namespace: chains are written under its root and
looked up from it (see :mod:`kvcache.store_format`), and a session's row is named within
it, so the disk serves a prompt only what its own namespace wrote.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from kvcache.disk_index import DiskIndex
from kvcache.joiner import Joiner
from kvcache.kv_pages import arrays_per_token, regroup, store_fingerprint, tokens_of
from kvcache.prefix_cache import PrefixCache, cache_source
from kvcache.priority import lower_thread_priority
from kvcache.serialize import (
    SerializeError,
    kv_to_bytes,
    kv_views,
    snapshot_from_bytes,
    snapshot_to_bytes,
)
from kvcache.snapshot import Snapshot
from kvcache.stats import DiskTierStats
from kvcache.store import (
    DEFAULT_BUDGET,
    ChainPage,
    DiskStore,
    DiskStoreError,
    IndexedPage,
    PageData,
    SessionReader,
    chain_keys,
    namespace_root,
    pack_tokens,
    save_bytes_for,
    session_row,
)
from kvcache.unwritten import UnwrittenPages, read_chain

log = logging.getLogger(__name__)

DISK_PAGE_TOKENS = 64  # tokens per stored page: fewer rows than pool pages, same bytes
MIN_WRITE_TOKENS = 256  # an unnamed request shorter than this is not worth a disk write
RETRY_AFTER_S = 60.0  # after a full disk, writes start again this much later
_RATE_WEIGHT = 0.3  # weight of the newest measurement in the running rates
# The writer thread's CPU priority (Linux nice): it hashes and writes megabytes per request
# while the engine prefills the next one; on a machine of few cores it took the cores from
# that prefill (a follow-up's time to first token: docs/benchmarks.md). At 19 it runs
# when they are idle.
WRITER_NICENESS = 19


@dataclass(frozen=True)
class _SaveJob:
    session: str | None  # the session's row (see session_row); None: a prefix, kept by its tokens
    pages: tuple[PageData, ...]
    queued: frozenset[str]  # keys of the pages serialized for it (not to serialize again)
    namespace: str = ""
    keys: tuple[str, ...] = ()  # the pages' keys, in order


@dataclass(frozen=True)
class _Unserialized:
    """A save whose new pages are still MLX arrays: ``layers[i]`` is full-attention layer
    ``i``'s (keys, values) of tokens ``lo..`` (slices of the request's own caches: MLX
    arrays are values, so a later in-place update of those caches leaves them as they
    were). ``pages`` are (tokens, start, end, snapshot, stored), ``stored`` for a page the
    disk has or is getting; ``row`` the session's row (None: a prefix)."""

    row: str | None
    pages: tuple[tuple[tuple[int, ...], int, int, Snapshot | None, bool], ...]
    layers: tuple[tuple[mx.array, mx.array], ...]
    lo: int
    queued: frozenset[str]
    namespace: str
    keys: tuple[str, ...]


_BUDGET = "enforce the budget"  # a job: make the store fit its budget (at load)


@dataclass(frozen=True)
class _ForgetJob:
    session: str


@dataclass(frozen=True)
class _RecordJob:
    """A restore's reading to record: pages used, pages found bad."""

    session: str | None
    used: tuple[ChainPage, ...]
    suspects: frozenset[str]
    head: tuple[str, int] | None  # a read by tokens: the last page used and its end


class DiskTier:
    """The disk tier of one loaded model (engine thread API; a writer thread inside)."""

    def __init__(
        self,
        path: Path,
        prefix_cache: PrefixCache,
        fingerprint: str,
        budget_bytes: int = DEFAULT_BUDGET,
        min_write_tokens: int = MIN_WRITE_TOKENS,
    ):
        self.prefix_cache = prefix_cache
        self.model_fingerprint = fingerprint
        # what pages are keyed by: the model's fingerprint and the KV format (kvcache.kv_pages)
        self.fingerprint = fingerprint = store_fingerprint(fingerprint, prefix_cache.layout)
        self.min_write_tokens = min_write_tokens
        # budget_bytes: the files' (the database and its log), not the pages' alone
        budget = dict(budget_bytes=budget_bytes, save_bytes=save_bytes_for(budget_bytes))
        self.reader = DiskStore(path, **budget)  # raises DiskStoreError
        try:
            self._writer = DiskStore(path, **budget)
            self.index = DiskIndex(fingerprint, self.reader.index(fingerprint))
        except BaseException:
            self.reader.close()
            raise
        layout = prefix_cache.build.layout
        self._token_bytes = layout.bytes_per_token if layout is not None else 0
        self._jobs: queue.Queue = queue.Queue()
        # keys serialized and not yet written (engine adds, writer removes)
        self._queued: set[str] = set()
        # their bytes, until written: a restore reads them from there (kvcache.unwritten)
        self.unwritten = UnwrittenPages()
        # saves waiting for serialize_pending (engine thread)
        self._unserialized: list[_Unserialized] = []
        self.last_error: str | None = None
        self._stopped_until = 0.0  # writes are off until then (disk full)
        self._counts = dict(
            reads=0,
            read_tokens=0,
            read_bytes=0,
            skipped_reads=0,
            pages_written=0,
            bytes_written=0,
            pages_not_rewritten=0,
            write_errors=0,
            write_backs=0,
        )
        self._read_rate = 0.0  # bytes/s, running
        self._prefill_rate = 0.0  # tokens/s, running
        self._thread = threading.Thread(
            target=self._write_loop, name="radixchat-cache-writer", daemon=True
        )
        self._thread.start()
        self._jobs.put(_BUDGET)  # a lowered budget, another model's pages, a crash: fit now

    # ------------------------------------------------------------ engine thread
    def stats(self) -> DiskTierStats:
        stopped = self.last_error if time.monotonic() < self._stopped_until else None
        return DiskTierStats(
            indexed_pages=len(self.index),
            writes_stopped=stopped,
            read_bytes_per_s=self._read_rate,
            prefill_tokens_per_s=self._prefill_rate,
            **self._counts,
        )

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """A prefill of ``tokens`` took ``seconds``: the rate a restore must beat."""
        if tokens >= DISK_PAGE_TOKENS and seconds > 0:
            self._prefill_rate = _running(self._prefill_rate, tokens / seconds)

    def save(
        self,
        session: str | None,
        tokens: list[int],
        caches: list,
        snapshots: list[Snapshot],
        namespace: str = "",
    ) -> None:
        """Queue the chain of ``tokens`` (``caches`` hold exactly them) for writing in
        ``namespace``: a session's always, an unnamed request's when it reaches
        ``min_write_tokens``.

        Only the pages' K/V are taken now (slices, no copy); their bytes are made by
        :meth:`serialize_pending`, which the engine calls once the request's reply has been
        sent: serializing a long prompt's pages takes tens of milliseconds the client
        need not wait for."""
        self._save(
            session,
            tokens,
            cache_source(caches, self.prefix_cache.paged),
            snapshots,
            namespace,
            later=True,
        )

    def serialize_pending(self) -> None:
        """Make the bytes of the pages :meth:`save` took and hand them to the writer thread
        (engine thread; the engine calls it between requests, ``flush`` before it waits)."""
        pending, self._unserialized = self._unserialized, []
        for save in pending:
            try:
                pages = tuple(
                    PageData(chunk, None)
                    if stored
                    else PageData(
                        chunk,
                        kv_to_bytes(
                            [
                                (
                                    tokens_of(k, a - save.lo, b - save.lo),
                                    tokens_of(v, a - save.lo, b - save.lo),
                                )
                                for k, v in save.layers
                            ]
                        ),
                        snapshot_to_bytes(snapshot) if snapshot else None,
                    )
                    for chunk, a, b, snapshot, stored in save.pages
                )
            except Exception:  # the cache costs a recompute later, no more
                self._counts["write_errors"] += 1
                self._queued.difference_update(save.queued)
                log.exception("serializing a cached prefix failed")
                continue
            self._hand_over(_SaveJob(save.row, pages, save.queued, save.namespace, save.keys))

    def write_back(
        self, tokens: list[int], source, snapshots: list[Snapshot], namespace: str = ""
    ) -> None:
        """RAM is evicting the prefix ``tokens`` of ``namespace`` (its K/V from ``source``,
        as the pool still holds it): queue what the disk lacks of it, so RAM pressure costs
        a read later, not a recompute (``kvcache.tiered`` passes it to the prefix cache)."""
        self._counts["write_backs"] += 1
        self._save(None, tokens, source, snapshots, namespace, min_tokens=DISK_PAGE_TOKENS)

    def _save(
        self,
        session: str | None,
        tokens: list[int],
        source,
        snapshots: list[Snapshot],
        namespace: str = "",
        min_tokens: int | None = None,
        later: bool = False,
    ) -> None:
        """The chain of ``tokens`` in ``namespace``, K/V from ``source(layer, a, b)``, to
        the writer thread.

        Pages end every ``DISK_PAGE_TOKENS`` tokens and at every snapshot (the end of the
        prompt, the end of the reply), and carry the snapshot that ends with them, so a
        hybrid model can resume from any of those points after a restart. Pages the disk
        has are not serialized; an unnamed chain the disk has whole is not queued at all.
        ``later``: take the new pages' K/V as slices of ``source`` and serialize them in
        :meth:`serialize_pending` (``source`` must give arrays that stay as they are, as a
        request's own caches do; the pool's pages do not: they are reused in place).
        """
        if session is None and len(tokens) < (
            self.min_write_tokens if min_tokens is None else min_tokens
        ):
            return
        if time.monotonic() < self._stopped_until:
            return  # the disk is full: serving goes on without writing
        by_end = {s.length: s for s in snapshots if 0 < s.length <= len(tokens)}
        if self.prefix_cache.hybrid and len(tokens) not in by_end:
            return  # a hybrid chain must be resumable at least at its end
        full = self.prefix_cache.paged
        ends = sorted(
            set(range(DISK_PAGE_TOKENS, len(tokens), DISK_PAGE_TOKENS))
            | set(by_end)
            | {len(tokens)}
        )
        starts = [0, *ends[:-1]]
        keys = chain_keys(self.fingerprint, [tokens[a:b] for a, b in zip(starts, ends)], namespace)
        plan = []  # (tokens, start, end, snapshot, stored)
        for start, end, key in zip(starts, ends, keys):
            snapshot = by_end.get(end)
            stored = (
                key in self.index
                and (snapshot is None or self.index.has_snapshot(key))
                or key in self._queued
            )  # stored, or on its way
            plan.append((tuple(tokens[start:end]), start, end, snapshot, stored))
        known = sum(stored for *_, stored in plan)
        self._counts["pages_not_rewritten"] += known
        if session is None and known == len(plan):
            return  # all on disk already: nothing to write
        queued = frozenset(key for key, page in zip(keys, plan) if not page[-1])
        self._queued |= queued
        row = session_row(session, namespace) if session is not None else None
        if later:
            lo = min((start for _, start, _, _, stored in plan if not stored), default=0)
            layers = tuple(source(i, lo, len(tokens)) for i in range(len(full))) if queued else ()
            self._unserialized.append(
                _Unserialized(row, tuple(plan), layers, lo, queued, namespace, tuple(keys))
            )
            return
        pages = tuple(
            PageData(chunk, None)
            if stored
            else PageData(
                chunk,
                kv_to_bytes([source(i, start, end) for i in range(len(full))]),
                snapshot_to_bytes(snapshot) if snapshot else None,
            )
            for chunk, start, end, snapshot, stored in plan
        )
        self._hand_over(_SaveJob(row, pages, queued, namespace, tuple(keys)))

    def _hand_over(self, job: _SaveJob) -> None:
        """Queue ``job`` for the writer thread. Its new pages are indexed now and read from
        memory until the writer has written them (:mod:`kvcache.unwritten`): a writer that
        falls behind (nice 19 on a busy machine) costs no restore."""
        self.unwritten.add(job.keys, job.pages)
        parents = [namespace_root(job.namespace), *job.keys[:-1]]
        self.index.add(
            IndexedPage(key, parent, pack_tokens(page.tokens), page.snapshot is not None)
            for key, parent, page in zip(job.keys, parents, job.pages)
            if page.kv is not None
        )
        self._jobs.put(job)

    def restore(self, prompt: list[int], session: str | None = None, namespace: str = "") -> int:
        """Bring what the disk holds of ``prompt`` in ``namespace`` beyond what RAM holds
        into RAM, if reading it beats computing it. Returns the tokens restored (0 when
        nothing was needed, found or worth it). Any failure here costs a recompute, never
        the request."""
        try:
            restored = self._restore_by_tokens(prompt, namespace)
            if not restored and session is not None:  # saved by another process since the load
                restored = self._restore_session(session, prompt, namespace)
            return restored
        except (DiskStoreError, SerializeError, ValueError, AttributeError, KeyError) as exc:
            self.last_error = str(exc)
            log.warning("restoring a cached prefix failed: %s", exc)
            return 0

    def _restore_by_tokens(self, prompt: list[int], namespace: str) -> int:
        usable_limit = len(prompt) - 1  # the last prompt token is always computed
        chain = self.index.match(prompt, namespace)
        if not chain:
            return 0
        best = _resume_point(chain, prompt, usable_limit, self.prefix_cache.hybrid)
        in_ram = self.prefix_cache.cached_length(prompt[:usable_limit], namespace)
        if best <= in_ram or not self._worth_reading(best - in_ram):
            return 0
        if not self._fits(best):
            return 0  # the pool can never hold it: don't read it only to drop it
        reading = None
        count = _pages_for(chain, best)
        try:
            with read_chain(
                self.reader, self.fingerprint, chain[:count], namespace, self.unwritten
            ) as reading:
                self.index.discard(reading.missing)  # deleted by another process
                if len(reading.chain) < count:  # cut short: what is left may still serve
                    best = _resume_point(
                        reading.chain, prompt, usable_limit, self.prefix_cache.hybrid
                    )
                    count = len(reading.chain)
                    if best <= in_ram:
                        return 0
                return self._insert(
                    prompt[:best], reading, in_ram, namespace, room=len(prompt) - best + 1
                )
        finally:  # marking pages used takes the write lock: the writer thread waits for it
            if reading is not None and (reading.used or reading.suspects):
                last = reading.used[-1].key if reading.used else None
                end = sum(len(page.tokens) for page in chain[:count])
                head = (last, end) if count and last == chain[count - 1].key else None
                self._jobs.put(
                    _RecordJob(None, tuple(reading.used), frozenset(reading.suspects), head)
                )

    def _fits(self, tokens: int) -> bool:
        """Whether the pool can hold ``tokens`` tokens at all (always, for a model that
        pages nothing: its snapshots are the cache)."""
        if not self.prefix_cache.paged:
            return True
        return -(-tokens // self.prefix_cache.page_size) <= self.prefix_cache.allocator.num_pages

    def _worth_reading(self, tokens: int) -> bool:
        if read_pays(tokens, self._token_bytes, self._read_rate, self._prefill_rate):
            return True
        self._counts["skipped_reads"] += 1
        return False

    def _restore_session(self, session: str, prompt: list[int], namespace: str) -> int:
        usable_limit = len(prompt) - 1
        in_ram = self.prefix_cache.cached_length(prompt[:usable_limit], namespace)
        session = session_row(session, namespace)
        stored = self.reader.session(session)
        if stored is None or stored.fingerprint != self.fingerprint or stored.tokens <= in_ram:
            return 0
        reading = None
        try:
            with self.reader.read_session(
                session, self.fingerprint, record=False, namespace=namespace
            ) as reading:
                best = _resume_point(reading.chain, prompt, usable_limit, self.prefix_cache.hybrid)
                if best <= in_ram:
                    return 0
                if not self._fits(best):
                    return 0  # the pool can never hold it: don't read it only to drop it
                return self._insert(
                    prompt[:best], reading, in_ram, namespace, room=len(prompt) - best + 1
                )
        finally:  # marking pages used takes the write lock: the writer thread waits for it
            if reading is not None and (reading.used or reading.suspects):
                self._jobs.put(
                    _RecordJob(session, tuple(reading.used), frozenset(reading.suspects), None)
                )

    def _insert(
        self, tokens: list[int], reading: SessionReader, start: int, namespace: str, room: int = 0
    ) -> int:
        """Restore ``tokens[start:]`` (of ``namespace``) from the chain being read, streaming
        its pages (those wholly before ``start``, which RAM holds, are not read). The K/V of
        each layer is joined into one buffer, RAM's part first (``tokens[:start]``, copied out
        of the pool), with ``room`` spare positions (rounded up to mlx-lm's KVCache step), so a
        request resuming from it takes it as its cache and prefills in place (see
        ``insert_restored``), whether or not RAM held the start of its prompt. A page that fails
        its check ends the stream: what came before it (back to a snapshot, for a hybrid model)
        is restored, the rest is recomputed."""
        began = time.perf_counter()
        layout = self.prefix_cache.layout
        layers = arrays_per_token(layout) if self.prefix_cache.paged else 0
        spare = KVCache.step * -(-(len(tokens) + max(room, 1)) // KVCache.step) - len(tokens)
        joined = Joiner(layers, len(tokens) + spare)
        count = _pages_for(reading.chain, len(tokens))
        first = offset = 0
        while first < count and offset + len(reading.chain[first].tokens) <= start:
            offset += len(reading.chain[first].tokens)
            first += 1
        snapshots, nbytes = {}, 0
        for page in reading.pages(count, first):
            take = min(len(page.tokens), len(tokens) - offset)
            nbytes += len(page.kv) + len(page.snapshot or b"")
            if offset + take > start and layers:
                lo = max(0, start - offset)
                views = kv_views(page.kv, layers, len(page.tokens), arrays=True)
                joined.add(offset + lo, take - lo, lo, views)
            if page.snapshot is not None and offset + len(page.tokens) <= len(tokens):
                snapshots[offset + len(page.tokens)] = page.snapshot
            offset += take
        end = max(snapshots, default=0) if self.prefix_cache.hybrid else offset
        if end <= start:
            return 0
        if start and layers:
            joined.add_arrays(0, self.prefix_cache.cached_kv(tokens[:start], namespace))
        snapshot = snapshot_from_bytes(snapshots[end]) if end in snapshots else None
        restored = self.prefix_cache.insert_restored(
            tokens[:end],
            start,
            regroup(joined.joined(), layout) if layers else [],
            snapshot,
            namespace,
        )
        if restored:
            seconds = time.perf_counter() - began
            self._read_rate = (
                _running(self._read_rate, nbytes / seconds) if seconds > 0 else self._read_rate
            )
            self._counts["reads"] += 1
            self._counts["read_tokens"] += restored
            self._counts["read_bytes"] += nbytes
        return restored

    def forget(self, session: str, namespace: str = "") -> None:
        """Queue the removal of ``session``'s cache (of ``namespace``) from disk (the chat
        was deleted); pages that other sessions share stay."""
        self._jobs.put(_ForgetJob(session_row(session, namespace)))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued save is written (tests, shutdown)."""
        self.serialize_pending()
        done = threading.Event()
        self._jobs.put(done)
        done.wait(timeout)

    @property
    def writer_thread_id(self) -> int | None:
        """The writer thread's native id (its CPU priority is ``WRITER_NICENESS``)."""
        return self._thread.native_id

    def close(self) -> None:
        self.flush(timeout=30)
        self._jobs.put(None)
        self._thread.join(timeout=30)  # the writer's connection closes first: the last one
        self.reader.close()  # to close checkpoints the log into the file

    # ------------------------------------------------------------ writer thread
    def _write_loop(self) -> None:
        lower_thread_priority(WRITER_NICENESS)
        while True:
            job = self._jobs.get()
            if job is None:
                self._writer.close()
                return
            if isinstance(job, threading.Event):
                job.set()
                continue
            try:
                self._do(job)
            finally:
                self._drain_deleted()
                if isinstance(job, _SaveJob):
                    self.unwritten.discard(job.keys)  # written by now, or failed
                    self._queued.difference_update(job.queued)

    def _do(self, job) -> None:
        if job is _BUDGET:
            try:
                self._writer.enforce_budget(self.fingerprint)
            except Exception as exc:  # the next save tries again
                log.warning("fitting the disk cache in its budget failed: %s", exc)
            return
        if isinstance(job, _RecordJob):
            try:
                self._writer.record_reading(
                    job.session, self.fingerprint, job.used, set(job.suspects), job.head
                )
            except Exception as exc:  # last-use times and repairs wait for the next read
                log.warning("recording a cache read failed: %s", exc)
            return
        if isinstance(job, _ForgetJob):
            try:
                self._writer.clear(job.session)
            except Exception as exc:  # as for a save: the writer thread must go on
                self.last_error = str(exc)
                log.warning("removing the cache of %s failed: %s", job.session, exc)
            return
        what = f"the cache of {job.session}" if job.session is not None else "a cached prefix"
        try:
            if job.session is not None:
                result = self._writer.save_session(
                    job.session, self.fingerprint, job.pages, job.namespace, job.keys or None
                )
            else:
                result = self._writer.save_prefix(
                    self.fingerprint, job.pages, job.namespace, job.keys or None
                )
        except DiskStoreError as exc:  # disk full, locked...: the cache costs time, no more
            self._counts["write_errors"] += 1
            if getattr(exc, "reason", None) == "full" or "full" in str(exc):
                self._stop_writes(str(exc))
            else:
                log.warning("saving %s failed: %s", what, exc)
            self.last_error = str(exc)
            self._forget_missing(job)
            return
        except Exception:
            self._counts["write_errors"] += 1
            log.exception("saving %s failed", what)
            self._forget_missing(job)
            return
        if result.gave_way:  # the disk is down to the store's reserve: nothing was written
            self._stop_writes(
                "the disk is nearly full: the KV cache keeps its reserve free "
                f"({self._writer.path})"
            )
        self._counts["pages_written"] += result.pages_written
        self._counts["bytes_written"] += result.bytes_written
        keys = job.keys[: result.pages]
        parents = [namespace_root(job.namespace), *keys[:-1]]
        self.index.add(
            IndexedPage(key, parent, pack_tokens(page.tokens), page.snapshot is not None)
            for key, parent, page in zip(keys, parents, job.pages)
        )
        if result.pages < len(job.pages):
            self._forget_missing(job)  # another process deleted pages (or none was written)

    def _stop_writes(self, why: str) -> None:
        """Writer thread: no writes for ``RETRY_AFTER_S`` (one log line when they stop)."""
        if time.monotonic() >= self._stopped_until:
            log.warning("disk cache writes stopped for %.0f s: %s", RETRY_AFTER_S, why)
        self.last_error = why
        self._stopped_until = time.monotonic() + RETRY_AFTER_S

    def _drain_deleted(self) -> None:
        deleted, self._writer.deleted_keys = self._writer.deleted_keys, []
        self.index.discard(deleted)

    def _forget_missing(self, failed: _SaveJob | None = None) -> None:
        """Writer thread: drop from the index the pages the store no longer has (or never
        got: ``failed``'s), but not those of the saves still on their way."""
        if failed is not None:
            self.unwritten.discard(failed.keys)
        try:
            missing = self._writer.missing_keys(self.index.keys())
            self.index.discard(missing - self.unwritten.keys())
        except Exception as exc:  # cannot tell: reads find out page by page
            log.warning("checking which cached pages are on disk failed: %s", exc)


def read_pays(
    tokens: int, token_bytes: int, read_bytes_per_s: float, prefill_tokens_per_s: float
) -> bool:
    """Whether reading ``tokens`` (``token_bytes`` each on disk) beats computing them, at
    the measured rates; True until both are measured (the first read measures the disk)."""
    if not (read_bytes_per_s and prefill_tokens_per_s):
        return True
    return tokens * token_bytes / read_bytes_per_s < tokens / prefill_tokens_per_s


def _running(rate: float, sample: float) -> float:
    return sample if not rate else (1 - _RATE_WEIGHT) * rate + _RATE_WEIGHT * sample


def _pages_for(chain: list[ChainPage], tokens: int) -> int:
    """How many of the chain's first pages cover ``tokens`` tokens."""
    count = offset = 0
    while offset < tokens and count < len(chain):
        offset += len(chain[count].tokens)
        count += 1
    return count


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
