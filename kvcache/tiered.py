"""The engine's one door to the KV cache: RAM above disk.

:class:`TieredCache` owns both tiers of one loaded model: the RAM tier
(:class:`~kvcache.prefix_cache.PrefixCache`, the radix tree over the page pool) and, when
one could be opened, the disk tier (:class:`~kvcache.persist.DiskTier`, the SQLite page
store). The engine asks it, and only it, for a prompt's cached prefix and hands it each
finished request; it never wires one tier to the other (as sglang hides its host tier
behind ``match_prefix`` and vLLM's scheduler sees only its KV cache manager)::

    cache = TieredCache(model, build, DiskSettings(path, fingerprint, budget))
    prefix = cache.match(prompt, namespace, session)  # disk read into RAM if it pays, locked
    caches = cache.make_caches(prefix, room)           # mlx-lm cache objects holding it
    ...prefill, decode...
    cache.commit(prefix, tokens, caches, snapshots, session)  # RAM now, disk off the thread
    cache.serialize_pending()                          # between requests: the disk's bytes

What one tier needs of the other is wired here, once: RAM hands an evicted prefix down
(the write-back is passed to the RAM tier at construction), the disk tier reads RAM's K/V
to join a restore to it. A disk file that is damaged or another program's is set aside
and a new one started (a cache only costs time to rebuild); a disk tier that still cannot
be opened (a read-only folder, a full disk) leaves RAM serving alone, saying why
(:attr:`TieredCache.disk_error`).

Engine thread only, as both tiers are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from kvcache.builder import KVCacheBuildResult
from kvcache.persist import MIN_WRITE_TOKENS, DiskTier
from kvcache.prefix_cache import Prefix, PrefixCache
from kvcache.snapshot import Snapshot
from kvcache.sqlite_file import remove_files, set_aside
from kvcache.stats import CacheStats, DiskTierStats
from kvcache.store import DiskStore, DiskStoreError, session_row

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DiskSettings:
    """Where and how a loaded model's disk tier keeps its pages."""

    path: Path  # the SQLite file (kvcache.db)
    fingerprint: str  # the model's: pages are reused only under the same one
    budget_bytes: int
    min_write_tokens: int = MIN_WRITE_TOKENS  # an unnamed request shorter stays off disk


class TieredCache:
    """The KV cache of one loaded model, both tiers behind one door (engine thread)."""

    def __init__(self, model, build: KVCacheBuildResult, disk: DiskSettings | None = None):
        self.ram = PrefixCache(model, build, write_back=self._write_back)
        self.disk: DiskTier | None = None
        self.disk_error: str | None = None  # why there is no disk tier, if one was asked for
        self._settings = disk
        if disk is not None and self.ram.enabled:
            self._open_disk()

    # ------------------------------------------------------------ the request path
    @property
    def enabled(self) -> bool:
        return self.ram.enabled

    @property
    def hybrid(self) -> bool:
        return self.ram.hybrid

    def match(self, prompt: list[int], namespace: str = "", session: str | None = None) -> Prefix:
        """The longest cached prefix of ``prompt`` in ``namespace``, locked until
        :meth:`commit` or :meth:`release`. What the disk holds beyond RAM is read into RAM
        first when reading beats computing (``session``: that chat's chain too, saved by
        another process since the load); ``Prefix.restored`` says how much came from disk."""
        restored = self.disk.restore(prompt, session, namespace) if self.disk is not None else 0
        return self.ram.match(prompt, namespace, restored=restored)

    def make_caches(self, prefix: Prefix, room: int = 0) -> list:
        return self.ram.make_caches(prefix, room)

    def fresh_caches(self) -> list:
        return self.ram.fresh_caches()

    def snapshot(self, caches: list, length: int) -> Snapshot | None:
        return self.ram.snapshot(caches, length)

    def commit(
        self,
        prefix: Prefix,
        tokens: list[int],
        caches: list,
        snapshots: list[Snapshot] = (),
        session: str | None = None,
    ) -> int:
        """A finished request: ``tokens`` (all ``caches`` hold) into RAM in the prefix's
        namespace, and queued for disk (a session's chain always, an unnamed request's when
        long enough; its bytes are made in :meth:`serialize_pending`). Releases the prefix.
        Returns the tokens new to RAM."""
        if self.disk is not None and self.ram.enabled:
            self.disk.save(session, tokens, caches, list(snapshots), prefix.namespace)
        return self.ram.commit(prefix, tokens, caches, snapshots, session)

    def release(self, prefix: Prefix) -> None:
        """Give a prefix's lock back without storing anything (cancel, error)."""
        self.ram.release(prefix)

    def flush_writes(self) -> None:
        """Copy K/V restored from disk into the pool pages waiting for it (after the first
        token of the request that asked for it)."""
        self.ram.flush_writes()

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """A prefill's rate: what a disk read must beat to be worth it."""
        if self.disk is not None:
            self.disk.observe_prefill(tokens, seconds)

    # ------------------------------------------------------------ between requests
    def serialize_pending(self) -> None:
        """Make the bytes of the pages committed since the last call and hand them to the
        disk's writer thread (the engine calls this once replies are sent)."""
        if self.disk is not None:
            self.disk.serialize_pending()

    def forget_session(self, session: str, namespace: str = "") -> None:
        """A chat was deleted: its lock on RAM pages now, its chain on disk soon after
        (pages other chains share stay)."""
        self.ram.forget_session(session, namespace)
        if self.disk is not None:
            self.disk.forget(session, namespace)
        elif self._settings is not None:
            forget_stored_session(self._settings.path, session, namespace)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything committed so far is on disk (tests, benchmarks, a stop)."""
        if self.disk is not None:
            self.disk.flush(timeout)

    def give_way(self) -> int:
        """The disk is full and something that must be written (the chat history) needs the
        room: close the disk tier, delete its files (needs no free space) and start an empty
        one. Returns the bytes freed."""
        if self._settings is None:
            return 0
        self._close_disk()
        freed = remove_files(self._settings.path)
        if self.ram.enabled:
            self._open_disk()
        return freed

    def stats(self) -> CacheStats:
        return self.ram.stats()

    def disk_stats(self) -> DiskTierStats | None:
        return self.disk.stats() if self.disk is not None else None

    def close(self) -> None:
        """Write what is queued and close the disk tier (a model switch, a stop)."""
        self._close_disk()

    # ------------------------------------------------------------ the tiers' wiring
    def _write_back(self, tokens: list[int], source, snapshots: list[Snapshot], namespace: str):
        """RAM is evicting a prefix: the disk keeps what it lacks of it, so RAM pressure
        costs a read later instead of a recompute."""
        if self.disk is not None:
            self.disk.write_back(tokens, source, snapshots, namespace)

    def _open_disk(self) -> None:
        settings = self._settings
        for attempt in (1, 2):
            try:
                settings.path.parent.mkdir(parents=True, exist_ok=True)
                self.disk = DiskTier(
                    settings.path,
                    self.ram,
                    settings.fingerprint,
                    settings.budget_bytes,
                    settings.min_write_tokens,
                )
                self.disk_error = None
                return
            except DiskStoreError as exc:
                if attempt == 1 and getattr(exc, "reason", None) in ("corrupt", "foreign"):
                    try:
                        aside = set_aside(settings.path)
                    except OSError as rename_error:
                        exc = rename_error
                    else:
                        log.warning("%s; set aside as %s, starting a new KV cache", exc, aside.name)
                        continue
                error = exc
            except OSError as exc:
                error = exc
            log.warning("disk cache off: %s", error)
            self.disk_error = str(error)
            return

    def _close_disk(self) -> None:
        if self.disk is not None:
            self.disk.close()
            self.disk = None


def forget_stored_session(path: Path, session: str, namespace: str = "") -> None:
    """Drop a session's chain from the disk cache at ``path`` with no tier open (it was
    saved under another model, or the cache is off): pages no other chain holds go too."""
    if not path.exists():
        return
    try:
        with DiskStore(path) as store:
            store.clear(session_row(session, namespace))
    except DiskStoreError as exc:
        log.warning("removing the cache of %s failed: %s", session, exc)
