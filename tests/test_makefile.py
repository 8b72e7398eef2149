"""The Makefile's setup on a machine like a stock Mac (issue 27): it picks a Python that
RadixChat runs on (3.11 or newer: mlx-lm 0.32 needs it), or the one ``PYTHON=`` names, and
otherwise stops with one line saying how to get one; ``make app`` builds from the lock file,
whose exact versions lie within pyproject.toml's ranges.

``make -n`` prints the commands without running them; the PATH holds only fake Pythons
(each a real interpreter told it is another version), so what is installed here does not
count."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
MAKE = shutil.which("make")

needs_make = pytest.mark.skipif(MAKE is None, reason="make is not installed")
# Under `make test` these make runs would be sub-makes, printing "Entering/Leaving directory"
# lines around what they print: run each as a make of its own.
OWN_MAKE = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}


def fake_python(folder: Path, name: str, version: tuple[int, int]) -> Path:
    """``folder/name``: this interpreter, reporting ``version`` as its ``sys.version_info``."""
    path = folder / name
    major, minor = version
    path.write_text(f"""#!/bin/sh
if [ "$1" = "-c" ]; then
  exec {sys.executable} -c \\
    "import sys; sys.version_info = ({major}, {minor}, 0, 'final', 0); exec(sys.argv[1])" "$2"
fi
exec {sys.executable} "$@"
""")
    path.chmod(0o755)
    return path


def dry_run(
    tmp_path: Path, pythons: dict[str, tuple[int, int]], *args: str
) -> subprocess.CompletedProcess:
    """``make -n setup`` with only ``pythons`` on the PATH, into a venv that is not there yet."""
    bin_dir = tmp_path / (
        "path-" + "-".join(f"{n}={v}" for n, v in sorted(pythons.items())).replace(" ", "")
    )
    bin_dir.mkdir(parents=True)
    for name, version in pythons.items():
        fake_python(bin_dir, name, version)
    return subprocess.run(
        [MAKE, "-n", "setup", f"VENV={tmp_path / 'venv'}", *args],
        cwd=ROOT,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def venv_python(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 0, run.stderr
    line = next(line for line in run.stdout.splitlines() if " -m venv " in line)
    return Path(line.split()[0]).name


@needs_make
def test_the_newest_candidate_that_is_new_enough_is_picked(tmp_path):
    # a stock Mac's python3 is Xcode's 3.9; Homebrew added 3.12
    assert (
        venv_python(dry_run(tmp_path, {"python3": (3, 9), "python3.12": (3, 12)})) == "python3.12"
    )
    assert (
        venv_python(dry_run(tmp_path, {"python3.11": (3, 11), "python3.13": (3, 13)}))
        == "python3.13"
    )
    assert venv_python(dry_run(tmp_path, {"python3": (3, 12)})) == "python3"


@needs_make
def test_a_python_too_old_is_passed_over_even_under_a_candidates_name(tmp_path):
    assert venv_python(dry_run(tmp_path, {"python3.11": (3, 10), "python3": (3, 11)})) == "python3"


@needs_make
def test_without_a_python_new_enough_it_stops_with_one_line_saying_how_to_get_one(tmp_path):
    run = dry_run(tmp_path, {"python3": (3, 9), "python3.10": (3, 10)})
    assert run.returncode != 0 and "-m venv" not in run.stdout
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "Python 3.11 or newer" in lines[0] and "brew install python@3.13" in lines[0]
    assert "apt install python3-venv" in lines[0] and "PYTHON=" in lines[0]


@needs_make
def test_python_named_is_used_or_refused(tmp_path):
    bin_dir = tmp_path / "elsewhere"
    bin_dir.mkdir()
    chosen = fake_python(bin_dir, "my-python", (3, 12))
    run = dry_run(tmp_path, {"python3.13": (3, 13)}, f"PYTHON={chosen}")
    assert venv_python(run) == "my-python"  # named: used, though a newer one is on the PATH
    old = fake_python(bin_dir, "old-python", (3, 9))
    run = dry_run(tmp_path / "again", {"python3.13": (3, 13)}, f"PYTHON={old}")
    assert (
        run.returncode != 0
        and f"PYTHON={old}" in run.stderr
        and len(run.stderr.strip().splitlines()) == 1
    )


@needs_make
def test_cleaning_needs_no_python(tmp_path):
    run = subprocess.run(
        [MAKE, "-n", "clean"],
        cwd=ROOT,
        env={"PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and "rm -rf" in run.stdout, run.stderr


@needs_make
def test_the_app_is_built_from_the_lock_file(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()  # set up already: only the app's own steps are printed
    run = subprocess.run(
        [MAKE, "-n", "app", f"VENV={venv}"],
        cwd=ROOT,
        env=OWN_MAKE,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    installs = [line for line in run.stdout.splitlines() if "pip install" in line]
    assert installs[0].endswith("-r requirements-lock.txt")
    assert installs[1].endswith("--no-deps -e .")  # the project itself, adding nothing
    assert "pyinstaller" in run.stdout.splitlines()[-1]


PLATFORMS = {  # what markers see on each platform the app is built on, with the oldest Python
    "linux": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"},
    "darwin": {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"},
}


def _environment(platform: str) -> dict[str, str]:
    from packaging.markers import default_environment

    return {
        **default_environment(),
        **PLATFORMS[platform],
        "python_version": "3.11",
        "python_full_version": "3.11.9",
    }


def _pinned(platform: str) -> dict[str, Version]:
    """The lock's exact versions on ``platform``."""
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements-lock.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(_environment(platform)):
                (spec,) = requirement.specifier
                assert spec.operator == "==", line
                assert _name(requirement.name) not in pins, (
                    f"{requirement.name} pinned twice for {platform}"
                )
                pins[_name(requirement.name)] = Version(spec.version)
    return pins


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_the_lock_pins_every_dependency_within_its_range(platform):
    """After a change to pyproject.toml's ranges, ``make lock`` writes the lock anew; this
    fails until it has."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [
        *project["dependencies"],
        *project["optional-dependencies"]["dev"],
        *project["optional-dependencies"]["package"],
    ]
    pins = _pinned(platform)
    problems = []
    for text in wanted:
        requirement = Requirement(text)
        if requirement.marker and not requirement.marker.evaluate(_environment(platform)):
            continue
        name = _name(requirement.name)
        if name not in pins:
            problems.append(f"{name} is not pinned")
        elif not requirement.specifier.contains(pins[name]):
            problems.append(f"{name}=={pins[name]} is outside {requirement.specifier}")
    assert not problems, (
        f"requirements-lock.txt is stale for {platform} (run `make lock`):\n  "
        + "\n  ".join(problems)
    )
    # MLX's kernels come as their own package, at MLX's version: Metal on a Mac, the CPU's on Linux
    kernels = "mlx-metal" if platform == "darwin" else "mlx-cpu"
    assert pins.get(kernels) == pins["mlx"], f"{kernels} is not pinned at mlx's version"
