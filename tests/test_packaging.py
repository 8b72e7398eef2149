"""Packaging: pyinstaller.spec's decisions, and the built bundle itself.

The spec tests run the spec with stand-ins for PyInstaller's build targets, so they need
no PyInstaller and take a second; they check both platforms' branches, the macOS one
included (its Info.plist), which can't be built here. The bundle tests run the built
``dist/RadixChat/radixchat`` and only when asked, with RADIXCHAT_BUNDLE_TESTS=1 (CI sets
it after `make app`; a bundle left from an earlier build may not match the sources):

    make app && RADIXCHAT_BUNDLE_TESTS=1 .venv/bin/python -m pytest tests/test_packaging.py
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "pyinstaller.spec"
BUNDLE = ROOT / "dist" / "RadixChat"
EXECUTABLE = BUNDLE / "radixchat"
VERSION = re.search(r'(?m)^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)


# ---------------------------------------------------------------------------- the spec


class Target:
    """Records what the spec passes to one of PyInstaller's build targets."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.binaries, self.datas, self.pure, self.scripts = (
            [],
            list(kwargs.get("datas", [])),
            [],
            [],
        )


def run_spec(monkeypatch, tmp_path, platform: str) -> dict:
    """Execute pyinstaller.spec as PyInstaller would, on ``platform``, with recording targets."""
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.collect_submodules = lambda package, filter=None: [f"{package}.stand_in"]
    hooks.collect_dynamic_libs = lambda package: [
        (f"/site-packages/{package}/lib/lib{package}.dylib", f"{package}/lib")
    ]
    hooks.copy_metadata = lambda package: [
        (f"/site-packages/{package}-1.0.dist-info", f"{package}-1.0.dist-info")
    ]
    bindepend = types.ModuleType("PyInstaller.depend.bindepend")
    bindepend.get_imports = lambda filename: []
    monkeypatch.setitem(sys.modules, "PyInstaller.utils.hooks", hooks)
    monkeypatch.setitem(sys.modules, "PyInstaller.depend.bindepend", bindepend)
    monkeypatch.setattr(sys, "platform", platform)
    made: dict = {}

    def recorder(name):
        def make(*args, **kwargs):
            made[name] = Target(*args, **kwargs)
            return made[name]

        return make

    namespace = {name: recorder(name) for name in ("Analysis", "PYZ", "EXE", "COLLECT", "BUNDLE")}
    namespace.update(
        SPECPATH=str(ROOT), workpath=str(tmp_path), __file__=str(SPEC), __name__="__main__"
    )
    exec(compile(SPEC.read_text(), str(SPEC), "exec"), namespace)
    return {"made": made, "namespace": namespace}


def test_the_grammar_librarys_metadata_is_bundled(monkeypatch, tmp_path):
    # llguidance reads its version from its metadata on import: without it every
    # constrained request failed in the bundle (its self-test caught it)
    datas = run_spec(monkeypatch, tmp_path, "linux")["made"]["Analysis"].kwargs["datas"]
    assert ("/site-packages/llguidance-1.0.dist-info", "llguidance-1.0.dist-info") in datas


def test_the_versions_radixchat_version_prints_are_bundled(monkeypatch, tmp_path):
    datas = run_spec(monkeypatch, tmp_path, "linux")["made"]["Analysis"].kwargs["datas"]
    # (the stand-in copy_metadata above names them as asked)
    for name in ("radixchat", "mlx", "mlx-lm"):
        assert (f"/site-packages/{name}-1.0.dist-info", f"{name}-1.0.dist-info") in datas, name


def test_linux_builds_one_folder_named_radixchat(monkeypatch, tmp_path):
    made = run_spec(monkeypatch, tmp_path, "linux")["made"]
    assert "BUNDLE" not in made
    assert made["EXE"].kwargs["name"] == "radixchat" and made["EXE"].kwargs["exclude_binaries"]
    assert made["EXE"].kwargs["console"] is True
    assert made["COLLECT"].kwargs["name"] == "RadixChat"
    analysis = made["Analysis"].kwargs
    assert analysis["pathex"] == [str(ROOT)]
    hidden = analysis["hiddenimports"]
    assert {"PySide6.QtCharts", "PySide6.QtSvg", "mlx_lm.models.stand_in", "mlx.stand_in"} <= set(
        hidden
    )
    excludes = set(analysis["excludes"])
    assert {
        "torch",
        "tensorflow",
        "jax",
        "PIL",
        "tests",
        "pytest",
        "PySide6.QtWebEngineCore",
        "PySide6.QtQml",
        "PySide6.QtQuick",
        "PySide6.QtNetwork",
    } <= excludes
    assert "transformers.models.llama.modeling_llama" in excludes
    assert not any(".tokenization_" in name or ".configuration_" in name for name in excludes)


def test_resources_ship_the_icons_but_not_the_icon_script(monkeypatch, tmp_path):
    datas = run_spec(monkeypatch, tmp_path, "linux")["made"]["Analysis"].kwargs["datas"]
    shipped = {Path(src).name for src, dest in datas if dest == "resources"}
    assert {
        "app.json",
        "RadixChat.png",
        "RadixChat.svg",
        "RadixChat.icns",
        "smollm2_tools.jinja",
    } <= shipped
    assert "make_icons.py" not in shipped


def test_the_benchmarks_stay_out_of_the_bundle_but_not_out_of_a_source_install(
    monkeypatch, tmp_path
):
    """bench/ is a package of the checkout (``radixchat bench NAME`` from an editable or a
    source install), left out of the app: excluded, and no hidden import reaches it."""
    import json
    import tomllib

    analysis = run_spec(monkeypatch, tmp_path, "linux")["made"]["Analysis"].kwargs
    assert "bench" in analysis["excludes"]
    hidden = analysis["hiddenimports"]
    assert "core.stand_in" in hidden  # (the stand-in names every collected package)
    assert not [name for name in hidden if name == "bench" or name.startswith("bench.")]
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    # setuptools' own finder, in a process of its own (importing setuptools replaces distutils)
    code = "import json, sys; from setuptools import find_packages; " + (
        "print(json.dumps(find_packages(sys.argv[1], include=json.loads(sys.argv[2]))))"
    )
    listed = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), json.dumps(find["find"]["include"])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    installed = json.loads(listed.stdout)
    assert "bench" in installed and "core.cli.commands" in installed
    assert not [name for name in installed if name.split(".")[0] == "tests"]


def test_macos_app_bundle_and_info_plist(monkeypatch, tmp_path):
    made = run_spec(monkeypatch, tmp_path, "darwin")["made"]
    # a console EXE would make BUNDLE write LSBackgroundOnly: no Dock icon, no menu bar
    assert made["EXE"].kwargs["console"] is False and made["EXE"].kwargs["argv_emulation"] is False
    bundle = made["BUNDLE"]
    # a one-folder .app (PyInstaller 6: from COLLECT, not EXE)
    assert bundle.args == (made["COLLECT"],)
    kwargs = bundle.kwargs
    assert kwargs["name"] == "RadixChat.app"
    assert kwargs["bundle_identifier"] == "org.radixchat.RadixChat"
    assert kwargs["version"] == VERSION
    assert Path(kwargs["icon"]) == ROOT / "resources" / "RadixChat.icns"
    assert ("/site-packages/mlx/lib/libmlx.dylib", "mlx/lib") in made["Analysis"].kwargs["binaries"]
    plist = kwargs["info_plist"]
    assert plist["CFBundleShortVersionString"] == plist["CFBundleVersion"] == VERSION
    assert plist["CFBundleName"] == plist["CFBundleDisplayName"] == "RadixChat"
    assert plist["NSHighResolutionCapable"] is True
    assert plist["NSRequiresAquaSystemAppearance"] is False
    assert plist["LSMinimumSystemVersion"] == "13.5"  # this machine's wheels carry no macOS tag
    # PyInstaller's docs: info_plist takes simple key/value pairs
    assert all(isinstance(value, (str, bool)) for value in plist.values())


def test_macos_minimum_follows_the_wheels(monkeypatch, tmp_path):
    import importlib.metadata

    class Wheel:
        def __init__(self, tag):
            self.tag = tag

        def read_text(self, name):
            return f"Wheel-Version: 1.0\nTag: {self.tag}\n"

    tags = {
        "mlx": "cp311-cp311-macosx_14_0_arm64",
        "PySide6-Essentials": "cp39-abi3-macosx_13_0_universal2",
    }

    def distribution(name):
        if name not in tags:
            raise importlib.metadata.PackageNotFoundError(name)
        return Wheel(tags[name])

    spec = run_spec(monkeypatch, tmp_path, "linux")["namespace"]
    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    assert spec["macos_minimum"]() == "14.0"
    tags["mlx"] = "cp311-cp311-macosx_13_0_arm64"
    assert spec["macos_minimum"]() == "13.5"


def test_macos_ships_mlx_metal_kernels_beside_libmlx(monkeypatch, tmp_path):
    """MLX loads mlx.metallib from libmlx.dylib's folder: the spec collects it to mlx/lib."""
    import importlib.machinery
    import importlib.util

    fake = tmp_path / "site-packages" / "mlx"
    (fake / "lib").mkdir(parents=True)
    (fake / "lib" / "mlx.metallib").write_bytes(b"MTLB")
    namespace = importlib.machinery.ModuleSpec("mlx", None, is_package=True)
    namespace.submodule_search_locations = [str(fake)]
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: namespace if name == "mlx" else real_find_spec(name, *args),
    )
    datas = run_spec(monkeypatch, tmp_path, "darwin")["made"]["Analysis"].kwargs["datas"]
    assert (str(fake / "lib" / "mlx.metallib"), "mlx/lib") in datas


def test_the_trimming_keeps_what_the_app_uses(monkeypatch, tmp_path):
    keep = run_spec(monkeypatch, tmp_path, "linux")["namespace"]["_keep"]
    plugins = "PySide6/Qt/plugins"
    for kept in (
        "platforms/libqxcb.so",
        "platforms/libqoffscreen.so",
        "platforms/libqwayland.so",
        "platforms/libqcocoa.dylib",
        "imageformats/libqsvg.so",
        "imageformats/libqjpeg.so",
        "iconengines/libqsvgicon.so",
        "platformthemes/libqxdgdesktopportal.so",
        "xcbglintegrations/libqxcb-glx-integration.so",
        "styles/libqmacstyle.dylib",
    ):
        assert keep(f"{plugins}/{kept}"), kept
    for dropped in (
        "platforms/libqeglfs.so",
        "platforms/libqvnc.so",
        "platforms/libqlinuxfb.so",
        "imageformats/libqpdf.so",
        "imageformats/libqtiff.so",
        "platformthemes/libqgtk3.so",
        "platforminputcontexts/libqtvirtualkeyboardplugin.so",
        "egldeviceintegrations/libqeglfs-kms.so",
    ):
        assert not keep(f"{plugins}/{dropped}"), dropped
    assert not keep("PySide6/Qt/translations/qtbase_de.qm")
    assert not keep("mlx/include/mlx/array.h")
    assert keep("mlx/lib/libmlx.so") and keep("mlx/lib/mlx.metallib")


def test_version_fallback_without_tomllib(monkeypatch, tmp_path):
    spec = run_spec(monkeypatch, tmp_path, "linux")["namespace"]
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python 3.10
    assert spec["project_version"]() == VERSION


def test_icons_are_real_images():
    png = (ROOT / "resources" / "RadixChat.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == 512
    small = (ROOT / "resources" / "RadixChat-256.png").read_bytes()
    assert int.from_bytes(small[16:20], "big") == 256
    icns = (ROOT / "resources" / "RadixChat.icns").read_bytes()
    assert icns[:4] == b"icns" and int.from_bytes(icns[4:8], "big") == len(icns)
    assert b"ic10" in icns and b"ic07" in icns  # 1024 px (512@2x) and 128 px entries


# ---------------------------------------------------------------------------- the bundle


@pytest.fixture(scope="module")
def bundle() -> Path:
    if os.environ.get("RADIXCHAT_BUNDLE_TESTS") != "1":
        pytest.skip("bundle tests: `make app`, then RADIXCHAT_BUNDLE_TESTS=1")
    if not EXECUTABLE.exists():
        pytest.fail(f"{EXECUTABLE} is missing: run `make app` first")
    return EXECUTABLE


def bundle_state() -> dict[str, tuple[int, int]]:
    """Every path in the bundle with its size and modification time."""
    return {
        str(p.relative_to(BUNDLE)): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in BUNDLE.rglob("*")
    }


def bundle_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    # the user's data, config and cache folders stay untouched
    env.update(
        QT_QPA_PLATFORM="offscreen",
        RADIXCHAT_HOME=str(home),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_CACHE_HOME=str(home / "cache"),
        XDG_DATA_HOME=str(home / "share"),
    )
    return env


def test_bundle_self_test_passes_and_writes_nothing_inside(bundle, tmp_path):
    before = bundle_state()
    done = subprocess.run(
        [str(bundle), "--self-test"],
        capture_output=True,
        text=True,
        timeout=300,
        env=bundle_env(tmp_path / "home"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("radixchat self-test: ok · mlx "), done.stdout
    assert "restored from disk" in done.stdout
    assert bundle_state() == before
    home = tmp_path / "home"
    assert not home.exists() or not any(home.iterdir())


def test_bundle_prints_its_versions(bundle, tmp_path):
    from importlib.metadata import version

    done = subprocess.run(
        [str(bundle), "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        env=bundle_env(tmp_path / "home"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"radixchat {VERSION} (mlx {version('mlx')}, mlx-lm {version('mlx-lm')}, "
    ), done.stdout


def test_bundled_gui_opens_offscreen(bundle, data_root_with_default, tmp_path):
    """The window opens on the real default model and keeps running until it is told to quit."""
    before = bundle_state()
    log = tmp_path / "gui.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(bundle), "--data-dir", str(data_root_with_default)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=bundle_env(tmp_path / "home"),
            cwd=tmp_path,
        )
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.5)
            still_running = proc.poll() is None
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    output = log.read_text(errors="replace")
    assert still_running, f"the bundled app exited with {proc.returncode}:\n{output}"
    assert "Traceback" not in output and "ModuleNotFoundError" not in output, output
    # the app used the data folder it was given
    assert (data_root_with_default / "chats.db").exists()
    assert bundle_state() == before


def test_bundle_takes_a_screenshot(bundle, data_root_with_default, tmp_path):
    """`--screenshot` from the bundle: the full window, both panels (QtCharts), the real model."""
    shot = tmp_path / "bundle.png"
    done = subprocess.run(
        [str(bundle), "--data-dir", str(data_root_with_default), "--screenshot", str(shot)],
        capture_output=True,
        text=True,
        timeout=600,
        env=bundle_env(tmp_path / "home"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 800 and height >= 600


def test_bundle_says_in_one_line_that_the_benchmarks_are_not_in_it(bundle, tmp_path):
    env = bundle_env(tmp_path / "home")
    listed = subprocess.run(
        [str(bundle), "bench", "--help"], capture_output=True, text=True, timeout=120, env=env
    )
    assert listed.returncode == 0 and "multiturn" in listed.stdout, listed.stderr
    done = subprocess.run(
        # (were the bench there, it would fail on the missing model, in other words)
        [str(bundle), "bench", "multiturn", "--model", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "radixchat: error: benchmarks are not in the packaged app: run them from a source "
        "checkout\n"
    )


def test_the_api_stack_is_bundled_with_uvicorns_named_parts(monkeypatch, tmp_path):
    from uvicorn.config import HTTP_PROTOCOLS, LIFESPAN, LOOP_FACTORIES

    from core.api.server import UVICORN_PARTS

    analysis = run_spec(monkeypatch, tmp_path, "linux")["made"]["Analysis"].kwargs
    hidden, excludes = set(analysis["hiddenimports"]), set(analysis["excludes"])
    for table, part in ((HTTP_PROTOCOLS, "http"), (LOOP_FACTORIES, "loop"), (LIFESPAN, "lifespan")):
        # imported by name at run time
        assert table[UVICORN_PARTS[part]].partition(":")[0] in hidden, part
    assert not {"pydantic", "pydantic_core", "fastapi", "starlette", "uvicorn", "h11"} & excludes
    assert {"openai", "anthropic"} <= excludes  # test clients only


def test_bundle_serves_a_group_through_itself(bundle, tmp_path):
    """`serve --hosts` from the bundle, which ships no mlx.launch: MLX's launcher runs as the
    executable's hidden `_launch-group`, and both ranks are the executable too (2 on loopback)."""
    from bench.server_process import wait_until_answers
    from core.models.tiny_model import TinyModelSpec, write_tiny_model
    from tests.core.distributed.group_fixture import Group, free_port, write_hostfile

    model = write_tiny_model(tmp_path / "tiny-llama", TinyModelSpec(num_layers=2))
    port, log = free_port(), tmp_path / "group.log"
    command = [
        str(bundle),
        "serve",
        "--hosts",
        str(write_hostfile(tmp_path / "hosts.json")),
        "--model",
        str(model),
        "--port",
        str(port),
        "--data-dir",
        str(tmp_path / "data"),
        "--ring-port",
        str(free_port(2)),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=bundle_env(tmp_path / "home"),
            cwd=tmp_path,
            start_new_session=True,
        )
    group = Group(proc, port, log, tmp_path / "data")
    try:
        assert wait_until_answers(proc, port, "/health", 300), group.output()
        reply = group.chat([{"role": "user", "content": "Hello over two ranks"}], max_tokens=8)
        assert reply["usage"]["completion_tokens"] > 0
    finally:
        group.stop()
    assert proc.returncode == 0, group.output()
    assert "split over 2 hosts" in group.output() and "Traceback" not in group.output()
