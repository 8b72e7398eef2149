"""What the hub names that becomes a path on disk, checked before anything is written.

A pull stores a repo as ``<HF cache>/models--org--name/{blobs/<etag>, snapshots/<commit>/<file>,
refs/<revision>}``, and the commit id, the file paths and the etags (the files' hashes) all
come from the hub's answer. A hostile hub (or a proxy in its place) could answer a commit
``../../../x`` or a file ``/home/me/.bashrc``: each is refused here, as huggingface_hub refuses
them, before a folder is made, so a refused repo leaves nothing behind.

- a commit id is 40 lowercase hex digits (huggingface_hub's ``REGEX_COMMIT_HASH``);
- a file path stays inside its snapshot under both POSIX and Windows rules (what
  huggingface_hub's downloads check before they touch the disk): no ``..`` segment
  (``/`` or ``\\`` separated), nothing absolute, no drive (``C:\\x``, ``C:x``) or UNC
  path (``\\\\host\\share``) in any segment, and no NUL, no empty name, no trailing ``/``;
- a blob is named by the file's SHA-256 (64 hex digits, LFS files) or git blob id (40).

These are the predicates; :mod:`core.models.hub.client` refuses a repo that fails one with a
one-line :class:`~core.models.hub.client.HubError`. The rules are written here rather than
imported: huggingface_hub's file-name check is private, and its commit pattern lives in
``file_download``, whose imports (its HTTP client and more) ``radixchat pull`` does not
otherwise pay for. A test keeps them equal.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath, PureWindowsPath

COMMIT_ID = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
GIT_BLOB_ID = re.compile(r"[0-9a-f]{40}")


def is_commit_id(commit: object) -> bool:
    return isinstance(commit, str) and COMMIT_ID.fullmatch(commit) is not None


def is_repo_path(path: object) -> bool:
    """Whether ``path`` (a file of a repo, '/' separated) stays inside the folder it is
    joined to, on POSIX and on Windows."""
    if not isinstance(path, str) or not path or path.endswith("/") or "\0" in path:
        return False
    if ".." in path.replace("\\", "/").split("/"):
        return False
    anchored = [PurePosixPath(path), *(PureWindowsPath(part) for part in path.split("/"))]
    return not any(p.drive or p.root for p in anchored)


def is_blob_name(sha256: object, blob_id: object) -> bool:
    """Whether the hashes a file is listed with name a blob: its SHA-256 (an LFS file),
    else its git blob id."""
    if sha256 is not None:
        return isinstance(sha256, str) and SHA256.fullmatch(sha256) is not None
    return isinstance(blob_id, str) and GIT_BLOB_ID.fullmatch(blob_id) is not None
