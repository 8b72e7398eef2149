"""A loopback Hugging Face hub: a threaded HTTP server in the hub's URL layout.

``huggingface_hub`` runs unchanged against it (``HF_ENDPOINT``). What it serves, read
off huggingface_hub 2.x's client code:

- ``GET /api/models?search=&filter=&sort=&limit=&expand=`` (HfApi.list_models);
- ``GET /api/models/{repo}[/revision/{rev}]`` with ``siblings`` (``rfilename``, ``size``,
  ``blobId``, ``lfs: {size, sha256, pointerSize}``) and ``sha`` (HfApi.model_info);
- ``GET /api/models/{repo}/tree/{rev}`` (HfApi.list_repo_tree: ``oid``, ``lfs.oid``);
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` with ``X-Repo-Commit``, ``ETag`` (the
  git blob id, or for an LFS file ``X-Linked-Etag``: its SHA-256), ``Content-Length``
  and ``Range`` requests (``206`` with ``Content-Range``);
- errors with the hub's ``X-Error-Code`` (RepoNotFound, GatedRepo, RevisionNotFound,
  EntryNotFound), which huggingface_hub turns into its typed errors.

Faults, to test the client for real: ``drop_after[(repo, path)] = n`` sends ``n`` bytes of
the next GET of that file and closes the connection; ``corrupt.add((repo, path))``
serves the file with one byte changed; ``rate`` limits bytes per second. Every body
byte sent is counted in ``bytes_served[(repo, path)]``.
"""

from __future__ import annotations

import collections
import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")
CHUNK = 1 << 20


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubFile:
    path: str
    data: bytes | None = None  # small files, in memory
    source: Path | None = None  # large files, read from disk

    def __post_init__(self):
        if self.data is None:
            assert self.source is not None
            self.size = self.source.stat().st_size
            digest = hashlib.sha256()
            with open(self.source, "rb") as f:
                while chunk := f.read(8 << 20):
                    digest.update(chunk)
            self.sha256 = digest.hexdigest()
        else:
            self.size = len(self.data)
            self.sha256 = hashlib.sha256(self.data).hexdigest()
        self.lfs = self.path.endswith(LFS_SUFFIXES)
        pointer = (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize "
            f"{self.size}\n"
        )
        self.pointer_size = len(pointer)
        self.blob_id = git_blob_id(pointer.encode() if self.lfs else self.read(0, self.size))
        self.etag = self.sha256 if self.lfs else self.blob_id

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        with open(self.source, "rb") as f:
            f.seek(start)
            return f.read(end - start)


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFile]
    downloads: int = 0
    tags: list[str] = field(default_factory=list)
    library_name: str | None = None
    gated: bool = False
    private: bool = False
    allowed_tokens: set[str] = field(default_factory=set)  # who may read a gated / private repo
    config: dict | None = None
    gguf: dict | None = None
    safetensors: dict | None = None
    commit: str = ""

    def __post_init__(self):
        if not self.commit:
            digest = hashlib.sha1(self.repo_id.encode())
            for f in sorted(self.files.values(), key=lambda f: f.path):
                digest.update(f.path.encode() + f.etag.encode())
            self.commit = digest.hexdigest()

    def card(self) -> dict:
        return {
            "id": self.repo_id,
            "modelId": self.repo_id,
            "sha": self.commit,
            "private": self.private,
            "gated": "manual" if self.gated else False,
            "downloads": self.downloads,
            "likes": 0,
            "tags": self.tags,
            "library_name": self.library_name,
            "config": self.config,
            "gguf": self.gguf,
            "safetensors": self.safetensors,
        }

    def info(self) -> dict:
        siblings = [
            {
                "rfilename": f.path,
                "size": f.size,
                "blobId": f.blob_id,
                **(
                    {"lfs": {"size": f.size, "sha256": f.sha256, "pointerSize": f.pointer_size}}
                    if f.lfs
                    else {}
                ),
            }
            for f in self.files.values()
        ]
        return {**self.card(), "siblings": siblings}

    def tree(self) -> list[dict]:
        return [
            {
                "type": "file",
                "oid": f.blob_id,
                "size": f.size,
                "path": f.path,
                **(
                    {"lfs": {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}}
                    if f.lfs
                    else {}
                ),
            }
            for f in self.files.values()
        ]


class LoopbackHub:
    """The server; ``url`` is what ``HF_ENDPOINT`` takes."""

    def __init__(self):
        self.repos: dict[str, HubRepo] = {}
        self.drop_after: dict[tuple[str, str], int] = {}
        self.corrupt: set[tuple[str, str]] = set()
        self.rate: float | None = None  # bytes per second for file bodies
        self.bytes_served: collections.Counter = collections.Counter()
        self.requests: list[tuple[str, str]] = []
        self.sending = 0  # file bodies being sent now
        # What GET /api/agent-harnesses answers: the registry of AI agents huggingface_hub
        # puts in its user agent, fetched from the hub once a day into HF_HOME. None: 404,
        # as before; the default, since an in-process client would keep the loopback's copy
        # in the real HF_HOME (huggingface_hub fixes that path when it is imported).
        self.agent_registry: dict | None = None
        self._lock = threading.Lock()
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="loopback-hub", daemon=True
        )
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo: HubRepo) -> HubRepo:
        self.repos[repo.repo_id] = repo
        return repo

    def add_folder(self, repo_id: str, folder: Path, **kwargs) -> HubRepo:
        """A repo of every file in ``folder`` (large ones read from disk as asked)."""
        files = {}
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            name = path.relative_to(folder).as_posix()
            files[name] = (
                HubFile(name, source=path)
                if path.stat().st_size > CHUNK
                else HubFile(name, data=path.read_bytes())
            )
        return self.add(HubRepo(repo_id, files, **kwargs))

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until no file body is being sent (a cancelled client's connection has
        been noticed), so ``bytes_served`` is final."""
        deadline = time.monotonic() + timeout
        while self.sending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not self.sending, "a transfer is still running"

    def served(self, repo_id: str, path: str | None = None) -> int:
        return sum(
            n
            for (r, p), n in self.bytes_served.items()
            if r == repo_id and (path is None or p == path)
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes: with Nagle's algorithm the body waited for the
    # client's delayed ACK, ~40 ms per API call (a real hub answers in one go).
    disable_nagle_algorithm = True
    hub: LoopbackHub

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # -- routing --

    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        query = parse_qs(url.query)
        with self.hub._lock:
            self.hub.requests.append((self.command, self.path))
        if parts == ["api", "agent-harnesses"] and self.hub.agent_registry is not None:
            return self._json(self.hub.agent_registry)
        if parts[:2] == ["api", "models"]:
            if len(parts) == 2:
                return self._json(self._search(query))
            repo = self._repo("/".join(parts[2:4]), files=False)
            if repo is None:
                return None
            rest = parts[4:]
            if not rest:
                return self._json(repo.info())
            if rest[0] == "revision" and len(rest) == 2 and self._revision(repo, rest[1]):
                return self._json(repo.info())
            if rest[0] == "tree" and len(rest) >= 2 and self._revision(repo, rest[1]):
                return self._json(repo.tree())
            if rest[0] in ("revision", "tree"):
                return None
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo = self._repo("/".join(parts[:2]), files=True)
            if repo is not None and self._revision(repo, parts[3]):
                # the rest of the path as sent: a hostile repo's absolute file name too
                return self._file(repo, unquote(url.path.split("/", 5)[5]), head)
            return None
        return self._error(404, "NotFound", "no such route")

    def _search(self, query: dict) -> list[dict]:
        text = (query.get("search") or [""])[0].lower()
        tags = set(query.get("filter") or [])
        found = [
            r
            for r in self.hub.repos.values()
            if text in r.repo_id.lower() and tags <= set(r.tags) and not r.private
        ]
        found.sort(key=lambda r: -r.downloads)
        limit = int((query.get("limit") or ["1000"])[0])
        return [r.card() for r in found[:limit]]

    def _token(self) -> str | None:
        value = self.headers.get("Authorization", "")
        return value[7:] if value.startswith("Bearer ") else None

    def _repo(self, repo_id: str, files: bool) -> HubRepo | None:
        repo = self.hub.repos.get(repo_id)
        token = self._token()
        if repo is None or (repo.private and token not in repo.allowed_tokens):
            self._error(401 if token is None else 404, "RepoNotFound", "Repository not found")
            return None
        if files and repo.gated and token not in repo.allowed_tokens:
            self._error(
                401 if token is None else 403,
                "GatedRepo",
                "Access to this model is restricted: you must accept its conditions",
            )
            return None
        return repo

    def _revision(self, repo: HubRepo, revision: str) -> bool:
        if revision in ("main", repo.commit):
            return True
        self._error(404, "RevisionNotFound", "Invalid rev id")
        return False

    # -- answers --

    def _json(self, value) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _file(self, repo: HubRepo, path: str, head: bool) -> None:
        file = repo.files.get(path)
        if file is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, end = 0, file.size
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes="):
            first, _, last = ranged[6:].partition("-")
            start = int(first or 0)
            end = min(file.size, int(last) + 1) if last else file.size
        self.send_response(206 if ranged else 200)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{file.etag}"')
        if file.lfs:
            self.send_header("X-Linked-Etag", f'"{file.sha256}"')
            self.send_header("X-Linked-Size", str(file.size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{file.size}")
        self.end_headers()
        if not head:
            self._body(repo, file, start, end)

    def _body(self, repo: HubRepo, file: HubFile, start: int, end: int) -> None:
        key = (repo.repo_id, file.path)
        hub = self.hub
        with hub._lock:
            drop = hub.drop_after.pop(key, None)
            corrupt = key in hub.corrupt
        stop = end if drop is None else min(end, start + drop)
        with hub._lock:
            hub.sending += 1
        try:
            self._send(key, file, start, stop, corrupt)
        finally:
            with hub._lock:
                hub.sending -= 1
        if drop is not None:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _send(
        self, key: tuple[str, str], file: HubFile, start: int, stop: int, corrupt: bool
    ) -> None:
        hub = self.hub
        if file.source is not None and not corrupt and hub.rate is None:
            with open(file.source, "rb") as f:  # the fast path: the kernel copies
                try:
                    sent = self.connection.sendfile(f, start, stop - start)
                except OSError:
                    return
            self._count(key, sent)
        else:
            position = start
            while position < stop:
                chunk = file.read(position, min(stop, position + CHUNK // 4))
                if corrupt and position <= file.size // 2 < position + len(chunk):
                    i = file.size // 2 - position
                    chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1 :]
                try:
                    self.wfile.write(chunk)
                except OSError:
                    return
                self._count(key, len(chunk))
                position += len(chunk)
                if hub.rate:
                    time.sleep(len(chunk) / hub.rate)

    def _count(self, key: tuple[str, str], n: int) -> None:
        with self.hub._lock:
            self.hub.bytes_served[key] += n


# the hub's answer's shape, no agent in it
AGENT_REGISTRY = {"standardEnvVars": [], "harnesses": {}}


def hub_environment(monkeypatch, hub: LoopbackHub, home: Path) -> Path:
    """Point huggingface_hub (and RadixChat) at ``hub``, with an HF home under ``home``."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return home / "hub"


def free_port_url() -> str:
    """A loopback URL where nothing listens (the hub is 'offline')."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# ---------------------------------------------------------------------------- the test repos

GOOD_TOKEN = "hf_loopback_good_token"
# a tiny float32 llama (1 MB of weights) + files a model doesn't need
TINY_MLX = "mlx-community/Tiny-Llama-128"
BIG_MLX = "mlx-community/Tiny-Llama-Wide"  # 27 MB of weights: several 10 MB chunks (cancel, resume)
OTHER_MLX = "someone/tiny-chat-mlx"  # more downloads, but not mlx-community
GIANT_MLX = "mlx-community/Giant-70B-4bit"  # the hub says 70B parameters: won't fit
TWO_GGUF = "gguf-org/Tiny-GGUF"  # two quantizations: choose one
ONE_GGUF = "gguf-org/Solo-GGUF"
MAMBA_GGUF = "gguf-org/Mamba-GGUF"  # a family the GGUF import can't map
BERT_MLX = "weird/bert-mlx"  # a model type mlx-lm can't load
NO_WEIGHTS = "empty/no-weights"
GATED = "gated-org/Gated-Tiny"
PRIVATE = "me/private-tiny"


@dataclass(frozen=True)
class HubSources:
    tiny: Path  # the tiny MLX model folder
    big: Path  # a wider one: its weights arrive in several chunks
    gguf: Path  # a small GGUF file
    parameters: int  # of the tiny model


def make_sources(folder: Path) -> HubSources:
    from core.models.catalog import safetensors_parameter_count
    from core.models.tiny_model import TinyModelSpec, write_tiny_model
    from tests.core.models.test_catalog import write_gguf

    tiny = write_tiny_model(folder / "tiny", TinyModelSpec(num_layers=2, hidden_size=128))
    big = write_tiny_model(
        folder / "big", TinyModelSpec(num_layers=2, hidden_size=256, intermediate_size=4096)
    )
    return HubSources(
        tiny, big, write_gguf(folder / "tiny.gguf"), safetensors_parameter_count(tiny)
    )


def add_test_repos(hub: LoopbackHub, sources: HubSources) -> None:
    model = {p.name: HubFile(p.name, data=p.read_bytes()) for p in sources.tiny.iterdir()}
    extras = {
        "README.md": HubFile("README.md", data=b"# tiny\n"),
        ".gitattributes": HubFile(".gitattributes", data=b"*.safetensors filter=lfs\n"),
        "pytorch_model.bin": HubFile("pytorch_model.bin", data=b"\0" * 4096),
        "onnx/model.onnx": HubFile("onnx/model.onnx", data=b"\1" * 4096),
    }
    n = sources.parameters
    mlx = dict(
        tags=["mlx", "safetensors"],
        library_name="mlx",
        config={"model_type": "llama"},
        safetensors={"parameters": {"F32": n}, "total": n},
    )
    hub.add(HubRepo(TINY_MLX, {**model, **extras}, downloads=500, **mlx))
    hub.add(HubRepo(OTHER_MLX, dict(model), downloads=900, **mlx))
    big = {p.name: HubFile(p.name, data=p.read_bytes()) for p in sources.big.iterdir()}
    hub.add(HubRepo(BIG_MLX, big, downloads=100, **mlx))
    hub.add(
        HubRepo(
            GIANT_MLX,
            dict(model),
            downloads=50,
            tags=["mlx"],
            library_name="mlx",
            config={"model_type": "llama", "quantization": {"bits": 4, "group_size": 64}},
            safetensors={
                "parameters": {"U32": 70_000_000_000 // 8, "BF16": 2_000_000_000},
                "total": 70_000_000_000 // 8 + 2_000_000_000,
            },
        )
    )
    gguf_bytes = sources.gguf.read_bytes()
    gguf = dict(tags=["gguf"], library_name="gguf")
    hub.add(
        HubRepo(
            TWO_GGUF,
            {
                "tiny-Q8_0.gguf": HubFile("tiny-Q8_0.gguf", data=gguf_bytes),
                "tiny-F16.gguf": HubFile("tiny-F16.gguf", data=gguf_bytes + b"\0" * 64),
                "big/big-Q8_0-00001-of-00002.gguf": HubFile(
                    "big/big-Q8_0-00001-of-00002.gguf", data=gguf_bytes
                ),
                "mmproj-tiny-F16.gguf": HubFile("mmproj-tiny-F16.gguf", data=gguf_bytes),
                "README.md": HubFile("README.md", data=b"# gguf\n"),
            },
            downloads=300,
            gguf={"total": 448, "architecture": "llama"},
            **gguf,
        )
    )
    hub.add(
        HubRepo(
            ONE_GGUF,
            {"solo-Q4_K_M.gguf": HubFile("solo-Q4_K_M.gguf", data=gguf_bytes)},
            downloads=30,
            gguf={"total": 448, "architecture": "llama"},
            **gguf,
        )
    )
    hub.add(
        HubRepo(
            MAMBA_GGUF,
            {"mamba-Q4_0.gguf": HubFile("mamba-Q4_0.gguf", data=gguf_bytes)},
            downloads=20,
            gguf={"total": 448, "architecture": "mamba"},
            **gguf,
        )
    )
    bert = {
        **model,
        "config.json": HubFile("config.json", data=json.dumps({"model_type": "bert"}).encode()),
    }
    hub.add(HubRepo(BERT_MLX, bert, downloads=10, tags=["mlx"], library_name="mlx"))
    hub.add(
        HubRepo(NO_WEIGHTS, {"README.md": HubFile("README.md", data=b"# nothing\n")}, tags=["mlx"])
    )
    hub.add(
        HubRepo(
            GATED,
            dict(model),
            tags=["mlx"],
            gated=True,
            allowed_tokens={GOOD_TOKEN},
            **{k: v for k, v in mlx.items() if k != "tags"},
        )
    )
    hub.add(HubRepo(PRIVATE, dict(model), private=True, allowed_tokens={GOOD_TOKEN}, **mlx))


@pytest.fixture(scope="session")
def hub_sources(tmp_path_factory) -> HubSources:
    return make_sources(tmp_path_factory.mktemp("hub-sources"))


@pytest.fixture
def loopback_hub(hub_sources, tmp_path, monkeypatch):
    """A running loopback hub with the test repos; huggingface_hub and RadixChat point at
    it, with an empty HF cache under tmp_path/hf-home."""
    hub = LoopbackHub()
    add_test_repos(hub, hub_sources)
    hub_environment(monkeypatch, hub, tmp_path / "hf-home")
    yield hub
    hub.close()


# serve a folder as a repo, by hand: python -m tests.core.models.hub.hub_fixture FOLDER
if __name__ == "__main__":
    import sys

    served = LoopbackHub()
    served.add_folder("local/" + Path(sys.argv[1]).name, Path(sys.argv[1]), tags=["mlx"])
    print(served.url, flush=True)
    threading.Event().wait()


__all__ = ["LoopbackHub", "HubRepo", "HubFile", "hub_environment", "free_port_url", "git_blob_id"]
