"""core.cpu_setup: the system OpenBLAS is loaded before mlx, with short worker spins."""

import os
import subprocess
import sys

import pytest

from core.cpu_setup import THREAD_TIMEOUT, blas_setup

pytestmark = pytest.mark.skipif(blas_setup().library is None, reason="no system OpenBLAS here")


def _in_fresh_python(env: dict) -> str:
    code = (
        "import os, core, mlx.core as mx; from core.cpu_setup import blas_setup; "
        "print(blas_setup().library is not None, os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    return result.stdout.strip()


def test_openblas_workers_spin_briefly_unless_the_user_says_otherwise():
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    assert _in_fresh_python(env) == f"True {THREAD_TIMEOUT}"
    assert _in_fresh_python({**env, "OPENBLAS_THREAD_TIMEOUT": "24"}) == "True 24"


def _openblas_mapped(imports: str) -> str:
    code = (
        f"import {imports}; print(any('libopenblas' in line for line in open('/proc/self/maps')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    return result.stdout.strip()


def test_openblas_is_loaded_at_the_first_import_of_mlx_not_before():
    assert _openblas_mapped("core, core.cli.main") == "False"  # `radixchat pull` never loads it
    assert _openblas_mapped("core, kvcache.pool") == "True"  # kvcache imports mlx, not core
