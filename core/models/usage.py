"""When each model was last loaded, and under which fingerprints.

The loader records every load here (``model_usage.json`` in the data folder), keyed by
the model's path: a snapshot folder or a GGUF file. Two things read it: the model lists
("last used") and deleting a model, which drops the KV cache saved under its
fingerprints (one per weight format it ran in) and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

USAGE_FILE = "model_usage.json"


@dataclass(frozen=True)
class ModelUse:
    path: str  # what the loader loaded (not resolved: a snapshot link stays a snapshot path)
    spec: str
    last_used: float  # time.time()
    fingerprints: tuple[str, ...]


def _file(data_root: Path) -> Path:
    return Path(data_root) / USAGE_FILE


def read_uses(data_root: Path) -> dict[str, ModelUse]:
    """Every recorded model by path; an unreadable file counts as empty (it only costs history)."""
    try:
        raw = json.loads(_file(data_root).read_text(encoding="utf-8"))
        return {
            path: ModelUse(
                path,
                str(entry.get("spec", "")),
                float(entry["last_used"]),
                tuple(entry.get("fingerprints", ())),
            )
            for path, entry in raw.items()
        }
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        log.warning("ignoring an unreadable %s", _file(data_root))
        return {}


def record_use(
    data_root: Path, path: Path | str, spec: str, fingerprint: str, now: float | None = None
) -> None:
    """Remember that ``path`` was loaded now under ``fingerprint`` (best effort)."""
    uses = read_uses(data_root)
    key = str(path)
    old = uses.get(key)
    fingerprints = tuple(dict.fromkeys((*(old.fingerprints if old else ()), fingerprint)))
    uses[key] = ModelUse(key, spec, time.time() if now is None else now, fingerprints)
    _write(data_root, uses)


def forget(data_root: Path, paths: list[str]) -> None:
    uses = read_uses(data_root)
    if any(uses.pop(p, None) for p in paths):
        _write(data_root, uses)


def uses_under(data_root: Path, folder: Path | str) -> list[ModelUse]:
    """The recorded models at ``folder`` or inside it (a repo's snapshots)."""
    prefix = str(folder).rstrip(os.sep)
    return [
        use
        for path, use in read_uses(data_root).items()
        if path == prefix or path.startswith(prefix + os.sep)
    ]


def _write(data_root: Path, uses: dict[str, ModelUse]) -> None:
    target = _file(data_root)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    data = {
        u.path: {"spec": u.spec, "last_used": u.last_used, "fingerprints": list(u.fingerprints)}
        for u in uses.values()
    }
    try:
        target.parent.mkdir(parents=True, exist_ok=True)  # the first load may come before it
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        log.warning("could not record model use in %s: %s", target, exc)
