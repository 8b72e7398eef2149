"""The Hugging Face hub's client: its endpoint, token and headers, a repo's files, and what a
download of a repo takes (:func:`plan`).

Everything goes through ``huggingface_hub``: its requests, headers, token, pagination,
``ModelInfo`` and errors. The endpoint (``HF_ENDPOINT``) and the token (``HF_TOKEN``, or the
one ``hf auth login`` stored) are read at call time, so a test can point the client at a
loopback hub. Each failure the user can act on is a :class:`HubError` with a one-line
reason: no network, no such repo, a gated or private repo, no weights RadixChat can use, an
architecture mlx-lm or the GGUF import can't map, an answer that is not safe to use (what
the hub names becomes paths on disk: see :mod:`core.models.hub.names`).

Searching the hub is :mod:`core.models.hub.search`; whether a model fits this machine,
estimated before any byte is downloaded, :mod:`core.models.hub.fit`.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import fnmatch
import logging
import os
import re
import socket
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from core.errors import UserError
from core.models.hub import names
from core.models.hub.fit import FITS, Fit, estimate_fit

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT = 3.0  # seconds to open a connection to the hub before saying "offline"
API_TIMEOUT = 15.0  # seconds for one API call
# What an MLX model needs (top-level files only): weights, config, tokenizer, chat template.
MLX_PATTERNS = (
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
)
SKIPPED_WEIGHTS = ("consolidated*.safetensors",)  # Mistral's original layout, beside the HF one


def gguf_architectures() -> tuple[str, ...]:
    """The GGUF families RadixChat's import maps (core.models.load.gguf_architectures),
    imported when a GGUF is looked at: the table reads gguf's key constants, and gguf brings
    numpy, which a pull of an MLX repo does not need."""
    from core.models.load.gguf_architectures import GGUF_ARCHITECTURES

    return GGUF_ARCHITECTURES


_SPLIT_GGUF = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)  # llama.cpp's gguf-split parts
_PROJECTOR_GGUF = re.compile(r"(^|/)mmproj[^/]*\.gguf$", re.IGNORECASE)  # vision projectors
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d_[A-Z0-9_]+|Q\d_\d|F16|BF16|F32)(?![A-Za-z0-9])", re.IGNORECASE
)


class HubError(UserError):
    """A hub request that cannot be done: one line saying why."""


class OfflineError(HubError):
    """The hub cannot be reached (no network, or HF_HUB_OFFLINE)."""


class ChooseFileError(HubError):
    """A GGUF repo with several files: the user picks one (``choices``)."""

    def __init__(self, message: str, choices: tuple[RepoFile, ...]):
        super().__init__(message)
        self.choices = choices


# ---------------------------------------------------------------------------- values


@dataclass(frozen=True)
class RepoFile:
    path: str
    size: int
    sha256: str | None  # LFS files: the content's SHA-256 (and the hub's ETag)
    blob_id: str  # git blob id: the SHA-1 of "blob <size>\0" + content for a plain file

    @property
    def etag(self) -> str:
        """The name huggingface_hub gives the file's blob in the cache."""
        return self.sha256 or self.blob_id

    @property
    def quantization(self) -> str | None:
        return quantization_of(self.path)


@dataclass(frozen=True)
class RepoPlan:
    """What downloading a repo (or one GGUF file of it) takes."""

    repo_id: str
    commit: str
    kind: str  # "mlx" | "gguf"
    files: tuple[RepoFile, ...]
    spec: str  # what the loader will take once it is downloaded
    architecture: str | None = None
    fit: Fit | None = field(default=None, compare=False)
    # a GGUF repo pulled without naming a file: which one was taken, and why (one line)
    note: str | None = field(default=None, compare=False)

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)


# ---------------------------------------------------------------------------- the client


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def token() -> str | None:
    """The user's HF token, as huggingface_hub's ``get_token`` finds it: a token exchanged
    through OIDC (``HF_OIDC_RESOURCE``), else ``HF_TOKEN`` (or ``HUGGING_FACE_HUB_TOKEN``),
    else the one ``hf auth login`` stored (an OAuth one is refreshed), else Colab's secret.

    Where the answer is certain without it (no OIDC; a token in the environment, or no
    token file and no IPython), it is read here: ``get_token``'s module imports
    huggingface_hub's errors, HTTP client, yaml and filelock (a good part of ``radixchat
    pull``'s start-up: docs/benchmarks.md). Otherwise ``get_token`` answers. A test keeps
    the two equal."""
    from huggingface_hub import constants

    if not os.environ.get("HF_OIDC_RESOURCE"):
        env = _clean_token(os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"))
        if env is not None:
            return env
        if not os.path.exists(constants.HF_TOKEN_PATH) and not hasattr(builtins, "get_ipython"):
            return None
    from huggingface_hub import get_token

    return get_token()


def _clean_token(value: str | None) -> str | None:
    """As huggingface_hub cleans a token: line breaks out, spaces trimmed, empty is none."""
    return None if value is None else (value.replace("\r", "").replace("\n", "").strip() or None)


def request_headers() -> dict[str, str]:
    """The headers of a request to the hub: what huggingface_hub's
    ``build_hf_headers(token=token() or False, library_name="radixchat")`` gives (its user
    agent, with the versions and, unless telemetry is off, torch's and the AI agent
    running us; the token), from its light modules only (``build_hf_headers``'s module
    imports ``get_token``'s). A test keeps the two equal; a huggingface_hub without these
    modules gets its own function."""
    try:
        from huggingface_hub import constants
        from huggingface_hub.utils._detect_agent import detect_agent
        from huggingface_hub.utils._runtime import (
            get_hf_hub_version,
            get_python_version,
            get_torch_version,
            is_torch_available,
        )
    except ImportError:  # another layout of huggingface_hub
        from huggingface_hub.utils import build_hf_headers

        return build_hf_headers(token=token() or False, library_name="radixchat")
    agent = f"radixchat/None; hf_hub/{get_hf_hub_version()}; python/{get_python_version()}"
    if not constants.HF_HUB_DISABLE_TELEMETRY:
        if is_torch_available():
            agent += f"; torch/{get_torch_version()}"
        if harness := detect_agent():
            agent += f"; agent/{harness}"
    if constants.HF_HUB_USER_AGENT_ORIGIN is not None:
        agent += "; origin/" + constants.HF_HUB_USER_AGENT_ORIGIN
    headers = {"user-agent": "; ".join({part.strip(): None for part in agent.split(";")})}
    if secret := token():
        headers["authorization"] = f"Bearer {secret}"
    return headers


def check_online() -> None:
    """Raise :class:`OfflineError` at once (no retries) when the hub can't be reached."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise OfflineError(
            "offline: HF_HUB_OFFLINE is set, so the hub is not asked (local models still work)"
        )
    if any(
        os.environ.get(v)
        for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")
    ):
        return  # through a proxy: a direct connection says nothing; the client's timeouts apply
    parts = urlsplit(endpoint())
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "", port), timeout=PROBE_TIMEOUT).close()
    except OSError as exc:
        raise OfflineError(
            f"offline: can't reach the Hugging Face hub at {endpoint()} "
            f"({exc.strerror or exc}); local models still work"
        ) from None


def repo_info(repo_id: str, revision: str = "main") -> dict:
    """One revision of a model repo with its files' metadata, as the hub's JSON: ``id``,
    ``sha``, ``siblings`` (``rfilename``, ``size``, ``blobId``, ``lfs.sha256``),
    ``config``, ``gguf``. The request ``HfApi.model_info(files_metadata=True)`` sends
    (``GET /api/models/{repo}/revision/{rev}?blobs=true``, huggingface_hub's headers and
    token), through :mod:`core.models.hub.http_get`: importing ``HfApi`` (its module defines
    a hundred dataclasses) took longer than the request, and ``radixchat pull`` needs
    nothing else of it. An HTTP error becomes huggingface_hub's own typed error, and then
    a :class:`HubError` as any other (gated, private, no such repo or revision)."""
    import json
    from urllib.parse import quote

    from core.models.hub import http_get

    check_repo_id(repo_id)
    url = f"{endpoint()}/api/models/{repo_id}/revision/{quote(revision, safe='')}?blobs=true"
    try:
        headers = _headers_once_online()
        with http_get.open_get(url, headers, timeout=API_TIMEOUT) as response:
            info = json.loads(response.read())
    except Exception as exc:
        raise hub_error(exc, repo_id) from None
    if not isinstance(info, dict) or not isinstance(info.get("sha"), str):
        raise HubError(f"the hub's answer for {repo_id} is not a model's revision: try again later")
    check_commit(info["sha"], repo_id)
    return info


def _headers_once_online() -> dict[str, str]:
    """:func:`request_headers`, once :func:`check_online` has passed: the probe's round
    trip runs on a thread while the headers are made (they import and read files, and
    once a day huggingface_hub fetches its registry of AI agents for the user agent)."""
    import threading

    failure: list[OfflineError] = []

    def probe() -> None:
        try:
            check_online()
        except OfflineError as exc:
            failure.append(exc)

    prober = threading.Thread(target=probe, name="hub-probe", daemon=True)
    prober.start()
    try:
        headers = request_headers()
    except Exception:
        prober.join()
        if failure:  # offline says more than what failed for want of the network
            raise failure[0] from None
        raise
    prober.join()
    if failure:
        raise failure[0]
    return headers


def file_url(repo_id: str, path: str, revision: str) -> str:
    """Where the hub serves a file of a repo at a revision (``hf_hub_url``'s layout)."""
    from urllib.parse import quote

    return f"{endpoint()}/{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"


def _repo_files(info: dict, repo_id: str) -> list[RepoFile]:
    """The files the hub lists, each checked before it can name a path on disk: one that
    is malformed or names a path outside the repo's folders refuses the whole repo (the
    hub's answer for it is not to be trusted), before anything is downloaded."""
    siblings = info.get("siblings")
    if siblings is None:
        return []
    if not isinstance(siblings, list):
        raise _refused(repo_id, "its list of files is not a list")
    files = []
    for s in siblings:
        if not isinstance(s, dict) or not isinstance(s.get("rfilename"), str):
            raise _refused(repo_id, f"it lists a file without a name: {str(s)[:80]!r}")
        lfs = s.get("lfs") if isinstance(s.get("lfs"), dict) else None
        size = s.get("size") if s.get("size") is not None else (lfs.get("size") if lfs else 0)
        files.append(
            check_file(
                RepoFile(
                    s["rfilename"], size, lfs.get("sha256") if lfs else None, s.get("blobId") or ""
                ),
                repo_id,
            )
        )
    return files


def _refused(repo_id: str, what: str) -> HubError:
    return HubError(f"the hub's answer for {repo_id} is refused: {what}; nothing was downloaded")


def check_commit(commit: object, repo_id: str) -> str:
    """``commit``, when it is a commit id (it names the snapshot's folder)."""
    if not names.is_commit_id(commit):
        raise _refused(repo_id, f"its commit id {commit!r} is not one (40 hex digits)")
    return commit


def check_repo_path(path: object, repo_id: str) -> str:
    """``path``, when it stays inside the snapshot folder it is joined to."""
    if not names.is_repo_path(path):
        raise _refused(repo_id, f"it lists a file path outside its snapshot folder: {path!r}")
    return path


def check_file(file: RepoFile, repo_id: str) -> RepoFile:
    """``file``, when its path, blob name (its hash) and size are safe to use."""
    check_repo_path(file.path, repo_id)
    if not names.is_blob_name(file.sha256, file.blob_id):
        raise _refused(
            repo_id,
            f"{file.path!r} is listed with a hash that is not one "
            f"({file.sha256 if file.sha256 is not None else file.blob_id!r})",
        )
    if isinstance(file.size, bool) or not isinstance(file.size, int) or file.size < 0:
        raise _refused(
            repo_id, f"{file.path!r} is listed with a size that is not one ({file.size!r})"
        )
    return file


def check_plan(plan: RepoPlan) -> RepoPlan:
    """``plan``, when every name in it is safe to join to the cache's folders (a plan from
    :func:`plan` always is: this is the last check before anything is written)."""
    check_commit(plan.commit, plan.repo_id)
    for file in plan.files:
        check_file(file, plan.repo_id)
    return plan


def check_repo_id(repo_id: str) -> None:
    if not _REPO_ID.match(repo_id or "") or ".." in repo_id:
        raise HubError(
            f"{repo_id!r} is not a Hugging Face repo id (owner/name, e.g. "
            "mlx-community/Qwen3-4B-4bit)"
        )


def hub_error(exc: Exception, repo_id: str | None = None) -> HubError:
    """A one-line :class:`HubError` for what ``huggingface_hub`` (or the network) raised."""
    from huggingface_hub import errors

    name = repo_id or "the repo"
    if isinstance(exc, HubError):
        return exc
    if isinstance(exc, errors.GatedRepoError):
        how = (
            "your token's account has not accepted its licence"
            if token()
            else "it needs your Hugging Face token (set HF_TOKEN or run `hf auth login`)"
        )
        return HubError(
            f"{name} is gated: {how}; accept its terms at {endpoint()}/{name}, then try again"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return HubError(f"{name} has no such revision")
    if isinstance(exc, errors.RepositoryNotFoundError):
        hint = "" if token() else " (if it is private, set HF_TOKEN or run `hf auth login`)"
        return HubError(f"no model repo {name} on the hub{hint}")
    if isinstance(exc, errors.RemoteEntryNotFoundError):
        return HubError(f"{name} has no such file")
    if isinstance(exc, errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        if status == 401:
            return HubError(
                f"the hub refused the token for {name} (HTTP 401): check HF_TOKEN or `hf auth "
                "login`"
            )
        return HubError(f"the hub answered HTTP {status} for {name}; try again later")
    if isinstance(exc, _network_errors()):
        return OfflineError(
            f"lost the connection to the hub at {endpoint()} ({type(exc).__name__}); try again"
        )
    return HubError(f"the hub request for {name} failed: {exc}")


def _network_errors() -> tuple[type[BaseException], ...]:
    """The HTTP libraries' transport errors: huggingface_hub 2.x uses httpx2, a download's
    body comes through the standard library (core.models.hub.http_get)."""
    import importlib

    from core.models.hub.http_get import network_errors

    for name in ("httpx2", "httpx"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        return (module.TransportError, *network_errors())
    return network_errors()


def quantization_of(name: str) -> str | None:
    """The quantization a file or repo name states (Q4_K_M, 4bit...), else None."""
    match = _QUANT.search(name.rsplit("/", 1)[-1])
    if match:
        return match.group(1).upper()
    match = re.search(r"(\d+)-?bit", name, re.IGNORECASE)
    return f"{match.group(1)}bit" if match else None


def mlx_lm_supports(model_type: str) -> bool:
    """Whether mlx-lm has a model for ``model_type``, found as mlx-lm finds it (its
    ``MODEL_REMAPPING``, then ``mlx_lm/models/<type>.py``) without importing mlx."""
    folder = _mlx_lm_folder()
    if folder is None:
        return False
    remapped = _mlx_lm_remapping(folder).get(model_type, model_type)
    return remapped.isidentifier() and os.path.isfile(
        os.path.join(folder, "models", f"{remapped}.py")
    )


@lru_cache(maxsize=1)
def _mlx_lm_folder() -> str | None:
    import importlib.util

    found = importlib.util.find_spec("mlx_lm")
    return (
        list(found.submodule_search_locations)[0]
        if found and found.submodule_search_locations
        else None
    )


@lru_cache(maxsize=1)
def _mlx_lm_remapping(folder: str) -> dict[str, str]:
    """``mlx_lm.utils.MODEL_REMAPPING``, read from its source (a dict literal): the
    assignment's own lines when they can be told apart (parsing the whole module slowed a
    pull's start), else the whole module."""
    try:
        source = Path(folder, "utils.py").read_text(encoding="utf-8")
    except OSError:
        return {}
    start = source.find("\nMODEL_REMAPPING = {")
    end = source.find("\n}", start)
    for text in ([source[start + 1 : end + 2]] if start >= 0 and end >= 0 else []) + [source]:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "MODEL_REMAPPING" for t in node.targets
            ):
                try:
                    return dict(ast.literal_eval(node.value))
                except ValueError:
                    return {}
    return {}


# ---------------------------------------------------------------------------- what to download


def plan(
    repo_id: str,
    filename: str | None = None,
    revision: str = "main",
    on_cpu: bool | None = None,
    machine_bytes: int | None = None,
) -> RepoPlan:
    """The files to download for ``repo_id`` (an MLX model's weights, config, tokenizer and
    template), or for one GGUF file of it; :class:`HubError` says why not."""
    info = repo_info(repo_id, revision)
    files = _repo_files(info, repo_id)
    commit = info["sha"]
    by_path = {f.path: f for f in files}
    ggufs = tuple(f for f in files if is_model_gguf(f.path))
    gguf_info = info.get("gguf") if isinstance(info.get("gguf"), dict) else {}
    if filename is not None:
        if not filename.lower().endswith(".gguf"):
            raise HubError(f"{repo_id}:{filename}: only a .gguf file can be pulled on its own")
        if filename not in by_path:
            raise HubError(
                f"{repo_id} has no file {filename}"
                + (f" (it has {', '.join(f.path for f in ggufs[:4])})" if ggufs else "")
            )
        if _SPLIT_GGUF.search(filename):
            raise HubError(
                f"{filename} is one part of a split GGUF: RadixChat loads single-file GGUFs only"
            )
        if _PROJECTOR_GGUF.search(filename):
            raise HubError(f"{filename} is a vision projector, not a language model")
        return _gguf_plan(repo_id, commit, by_path[filename], gguf_info, on_cpu, machine_bytes)
    weights = [
        f
        for f in files
        if "/" not in f.path
        and fnmatch.fnmatch(f.path, "*.safetensors")
        and not any(fnmatch.fnmatch(f.path, p) for p in SKIPPED_WEIGHTS)
    ]
    if weights and "config.json" in by_path:
        chosen = tuple(
            f
            for f in files
            if "/" not in f.path
            and any(fnmatch.fnmatch(f.path, p) for p in MLX_PATTERNS)
            and not any(fnmatch.fnmatch(f.path, p) for p in SKIPPED_WEIGHTS)
        )
        config = info.get("config") if isinstance(info.get("config"), dict) else {}
        architecture = config.get("model_type")
        if architecture and not mlx_lm_supports(architecture):
            raise HubError(f"{repo_id} is a {architecture} model, which mlx-lm can't load")
        size = sum(f.size for f in weights)
        fit = estimate_fit("hf-cache", size, None, on_cpu, machine_bytes)
        return RepoPlan(repo_id, commit, "mlx", chosen, repo_id, architecture, fit)
    if len(ggufs) == 1:
        return _gguf_plan(repo_id, commit, ggufs[0], gguf_info, on_cpu, machine_bytes)
    default = default_gguf(ggufs, on_cpu, machine_bytes)
    if default is not None:
        file, why = default
        chosen = _gguf_plan(repo_id, commit, file, gguf_info, on_cpu, machine_bytes)
        note = (
            f"{repo_id} has {len(ggufs)} GGUF files: taking {file.path} ({why}); "
            f"name another as {repo_id}:FILE"
        )
        return dataclasses.replace(chosen, note=note)
    if ggufs:
        raise ChooseFileError(
            f"none of the {len(ggufs)} GGUF files of {repo_id} fits this machine: choose one, "
            f"e.g. `radixchat pull {repo_id}:{ggufs[0].path}`",
            ggufs,
        )
    raise HubError(
        f"{repo_id} has no weights RadixChat can use (neither MLX .safetensors with a config.json "
        "nor a .gguf file)"
    )


def is_model_gguf(path: str) -> bool:
    """A single-file GGUF language model: not a split part, not a vision projector."""
    return (
        path.lower().endswith(".gguf")
        and not _SPLIT_GGUF.search(path)
        and not _PROJECTOR_GGUF.search(path)
    )


def gguf_files(repo_id: str, revision: str = "main") -> tuple[RepoFile, ...]:
    """The GGUF files of a repo (its quantizations), smallest first."""
    return tuple(
        sorted(
            (
                f
                for f in _repo_files(repo_info(repo_id, revision), repo_id)
                if is_model_gguf(f.path)
            ),
            key=lambda f: (f.size, f.path),
        )
    )


DEFAULT_QUANTIZATION = "Q4_K_M"


def default_gguf(
    files: tuple[RepoFile, ...], on_cpu: bool | None = None, machine_bytes: int | None = None
) -> tuple[RepoFile, str] | None:
    """The file of a GGUF repo to take when none is named, and why: its Q4_K_M (the usual
    balance of size and quality), else the smallest that fits this machine; None when none
    fits."""
    q4 = [f for f in files if f.quantization == DEFAULT_QUANTIZATION]
    if q4:
        return min(q4, key=lambda f: f.size), f"{DEFAULT_QUANTIZATION}, the usual balance"
    fitting = [
        f for f in files if estimate_fit("gguf", f.size, None, on_cpu, machine_bytes).label == FITS
    ]
    if fitting:
        return min(fitting, key=lambda f: f.size), "the smallest that fits this machine"
    return None


def _gguf_plan(
    repo_id: str, commit: str, file: RepoFile, gguf_info: dict, on_cpu, machine_bytes
) -> RepoPlan:
    architecture = gguf_info.get("architecture")
    if architecture and architecture not in gguf_architectures():
        raise HubError(
            f"{repo_id} is a GGUF of the {architecture} family, which RadixChat's import can't map "
            f"yet (it maps {', '.join(gguf_architectures())})"
        )
    fit = estimate_fit("gguf", file.size, None, on_cpu, machine_bytes)
    return RepoPlan(repo_id, commit, "gguf", (file,), f"{repo_id}:{file.path}", architecture, fit)


__all__ = [
    "HubError",
    "OfflineError",
    "ChooseFileError",
    "RepoFile",
    "RepoPlan",
    "plan",
    "gguf_files",
    "default_gguf",
    "DEFAULT_QUANTIZATION",
    "check_online",
    "hub_error",
]
