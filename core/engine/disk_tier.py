"""Opening the engine's disk tier (``kvcache.persist.DiskTier``) for a loaded model.

A cache file that is damaged or belongs to another program is set aside beside itself and
a new one started (a cache only costs time to rebuild); a disk tier that still cannot be
opened (a read-only folder, a full disk) leaves the engine running without one, saying why.
"""

from __future__ import annotations

import logging
from pathlib import Path

from kvcache.persist import MIN_WRITE_TOKENS, DiskTier
from kvcache.sqlite_file import set_aside
from kvcache.store import DiskStore, DiskStoreError, session_row

log = logging.getLogger(__name__)


def open_disk_tier(
    path: Path,
    prefix_cache,
    fingerprint: str,
    budget: int,
    min_tokens: int | None,
) -> tuple[DiskTier | None, str | None]:
    """``(tier, None)``, or ``(None, why)`` where no disk tier could be opened at ``path``
    (its folder is made if missing). ``min_tokens`` None: the tier's default."""
    for attempt in (1, 2):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tier = DiskTier(
                path,
                prefix_cache,
                fingerprint,
                budget,
                MIN_WRITE_TOKENS if min_tokens is None else min_tokens,
            )
            return tier, None
        except DiskStoreError as exc:
            if attempt == 1 and getattr(exc, "reason", None) in ("corrupt", "foreign"):
                # A cache only costs time to rebuild: keep the damaged file beside it
                # and start a new one, rather than run without a disk cache.
                try:
                    aside = set_aside(path)
                except OSError as rename_error:
                    exc = rename_error
                else:
                    log.warning("%s; set aside as %s, starting a new KV cache", exc, aside.name)
                    continue
            error = exc
        except OSError as exc:
            error = exc
        log.warning("disk cache off: %s", error)
        return None, str(error)
    return None, None


def forget_on_disk(path: Path, session: str, namespace: str) -> None:
    """Drop a session's chain from the disk cache at ``path`` with no tier open (it was saved
    under another model, or the cache is off): the pages no other chain holds go with it."""
    if not path.exists():
        return
    try:
        with DiskStore(path) as store:
            store.clear(session_row(session, namespace))
    except DiskStoreError as exc:
        log.warning("removing the cache of %s failed: %s", session, exc)
