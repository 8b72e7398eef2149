"""Shared fixtures: tiny generated models, the real default model, a headless Qt."""

from __future__ import annotations

import gc
import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest worker per core (pytest-xdist): one BLAS thread each, or
    # each worker's OpenBLAS threads spin against the other worker's for the same cores.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402

import core  # noqa: E402,F401  (loads the system OpenBLAS before anything imports mlx)
from core import paths  # noqa: E402
from core.models.pypi import provision  # noqa: E402
from tests.core.models.hub.hub_fixture import hub_sources, loopback_hub  # noqa: E402,F401  (the loopback hub)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny llama model (random weights, byte tokenizer, ChatML template)."""
    from core.models.tiny_model import TinyModelSpec, write_tiny_model

    return write_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-llama", TinyModelSpec(num_layers=2)
    )


@pytest.fixture(scope="session")
def long_tiny_model(tmp_path_factory) -> Path:
    """The tiny llama model with a 4096-token context: room for a tool-laden prompt or a
    reply that outlasts a test (its tokens are bytes)."""
    from core.models.tiny_model import TinyModelSpec, write_tiny_model

    return write_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-4k",
        TinyModelSpec(num_layers=2, max_position_embeddings=4096),
    )


@pytest.fixture(scope="session")
def default_model_file() -> Path:
    """The real default model (SmolLM2-135M-Instruct Q4_1 GGUF).

    Taken from the user's data folder (``$RADIXCHAT_HOME`` or the platform's), where the
    README's test command provisions it; fetched there if missing. Failing to get it
    fails the test: the real-model checks must not silently skip.
    """
    return provision.ensure_model("default", paths.data_dir())


@pytest.fixture
def data_root_with_default(tmp_path, default_model_file) -> Path:
    """A fresh data folder whose models/ links the real default model."""
    models = paths.models_dir(tmp_path)
    (models / default_model_file.name).symlink_to(default_model_file)
    return tmp_path


# -- `-m quick`: the inner loop (issue 44.7, as vLLM's cpu_test) --
# A test is quick unless it needs a model (a fixture below), starts servers, subprocesses or
# whole benches (the folders below), or carries a marker of the slow sets. Seconds, not
# minutes: `pytest -m quick` is the check to run after each edit, `make test` before a commit.
SLOW_FIXTURES = {
    "tiny_model",
    "long_tiny_model",
    "default_model_file",
    "data_root_with_default",
    "open_window",
    "loopback_hub",
}
SLOW_FOLDERS = (
    "bench",
    "faults",
    "core/distributed",
    "core/api",
    "core/engine",
    "core/cli",
    "core/mcp/test_hub",  # MCP servers as child processes or on loopback
    "core/mcp/test_npm",
)
SLOW_MARKERS = {"real_model", "model_matrix", "distributed", "faults", "mcp_npm"}


# Under pytest-xdist (`make test`), the files that take longest start first, so the run
# does not end with one process working through a long file while the other waits.
FIRST_FILES = (
    "core/engine/test_model_matrix.py",
    "core/distributed/test_group.py",
    "core/distributed/test_pipeline.py",
    "core/engine/test_disk_faults.py",
    "core/engine/test_disk_cache.py",
    "core/models/load/test_gguf_gemma.py",
    "core/engine/test_engine_cache.py",
    "core/engine/test_disk_tier.py",
    "bench/test_soak.py",
    "core/cli/test_main.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    root = Path(__file__).parent
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {name: i for i, name in enumerate(FIRST_FILES)}

        def first(item) -> int:
            return rank.get(Path(str(item.path)).relative_to(root).as_posix(), len(rank))

        items.sort(key=first)  # stable: each file's tests keep their order
    for item in items:
        where = Path(str(item.path)).relative_to(root).as_posix()
        if (
            SLOW_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
            and not where.startswith(SLOW_FOLDERS)
            and SLOW_MARKERS.isdisjoint(mark.name for mark in item.iter_markers())
        ):
            item.add_marker(pytest.mark.quick)


def pytest_collection_finish(session) -> None:
    """Every module, class and parameter the tests import lives as long as the run: frozen
    out of the cyclic collector's reach. The engine collects at each model load and stop (a
    few hundred times a run), and each full collection walked them all (on 22 families of
    the model matrix, beside a CPU hog: 22.6 of 88 s, 1.6 of 68 s once frozen)."""
    gc.collect()
    gc.freeze()
