"""Deleting a model of the data folder (``radixchat models rm NAME``, the picker's Delete), by
the name the model lists give it, as the hub's are deleted (``core.models.hub.installed``):
the file or folder, the files made from it at load, and the KV cache saved under its
fingerprints; other models' stay. A known model deleted is fetched again when next asked for.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from core.errors import UserError
from core.models import derived, usage
from core.models.hub.installed import Deleted, drop_cached_kv
from core.models.local import DATA_FOLDER_KINDS, LocalModel, folder_size, model_path


def delete_from_data_folder(data_root: Path, model: LocalModel) -> Deleted:
    """Delete a data folder model (known, GGUF file or MLX folder in ``<data>/models``), the
    files made from it, and the KV cache saved under its fingerprints; other models' stay."""
    path = model_path(data_root, model)
    if model.kind not in DATA_FOLDER_KINDS or path is None or not path.exists():
        raise UserError(f"no model {model.spec} in {Path(data_root) / 'models'}")
    uses = usage.uses_under(data_root, path)
    made = derived.derived_of(data_root, path) if path.is_file() else []
    derived_freed = derived.remove(made)  # its tokenizer, kept conversions
    if path.is_dir():
        freed = folder_size(path)
        shutil.rmtree(path)
    else:
        freed = path.stat().st_size
        path.unlink()
    sessions, kv_bytes = drop_cached_kv(data_root, {f for u in uses for f in u.fingerprints})
    usage.forget(data_root, [u.path for u in uses])
    return Deleted(model.spec, freed, sessions, kv_bytes, derived_freed)
