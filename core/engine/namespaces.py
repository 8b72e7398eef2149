"""Cache namespaces: who shares cached prefixes with whom.

The prefix cache (RAM and disk) serves a request only what requests of the same
namespace left there. Without that, ``cached_tokens`` is an oracle: a client that
guesses a prefix of someone else's prompt and watches how much of its own prompt the
cache served learns that prompt token by token (a 4-digit PIN in ~40 requests).

The front ends name the namespace of each request (``GenerationRequest.cache_namespace``):

- the app's own chats (the window and ``radixchat chat``): :data:`APP`;
- the HTTP API without keys (loopback only): :data:`API`, one namespace shared by every
  local client, as agents and their sub-agents want; a client that wants its prompts
  kept to itself adds a ``cache_salt`` (:func:`with_salt`);
- the HTTP API with keys: one namespace per key (:func:`for_key`), and a ``cache_salt``
  splits a key's namespace further.

Names are built from SHA-256 digests, never from a key itself; :func:`label` shortens
them for reports and panels (``key-1a2b3c4d+salt-5e6f7a8b``). ``""`` is the engine's
default, for requests no front end named (tests, benchmarks).
"""

from __future__ import annotations

import hashlib

APP = "app"
API = "api"
DEFAULT_LABEL = "default"
_KEY = "key-"
_SALT = "+salt-"
_LABEL_HEX = 8  # hex digits of a digest shown in a label


def _digest(kind: bytes, text: str) -> str:
    return hashlib.sha256(b"radixchat cache namespace\0" + kind + b"\0" + text.encode()).hexdigest()


def for_key(api_key: str) -> str:
    """The namespace of the API requests made with ``api_key``."""
    return _KEY + _digest(b"key", api_key)


def with_salt(namespace: str, salt: str | None) -> str:
    """``namespace`` split by a request's ``cache_salt``: requests share cached prefixes
    only with those of the same namespace and the same salt. None or "": no split."""
    if not salt:
        return namespace
    return f"{namespace}{_SALT}{_digest(b'salt', salt)}"


def owner(namespace: str) -> str:
    """Whose requests ``namespace`` holds: the namespace without its ``cache_salt`` (a
    client may split its own namespace with salts; it is still one client, as the
    scheduler's fair share and the API's per-client turns count them)."""
    return namespace.partition(_SALT)[0]


def label(namespace: str) -> str:
    """A short name for reports: no key, no salt, digests cut to a few hex digits."""
    if not namespace:
        return DEFAULT_LABEL
    base, sep, salt = namespace.partition(_SALT)
    if base.startswith(_KEY):
        base = base[: len(_KEY) + _LABEL_HEX]
    return base + (sep + salt[:_LABEL_HEX] if sep else "")
