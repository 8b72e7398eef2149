"""What the benches that run us beside mlx_lm.server share: the model saved as an MLX folder
(the same weights, config and tokenizer mlx_lm.server loads), a scratch data folder linking
the user's models, and the two servers started on free ports."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.agent import save_mlx_folder
from bench.harness import link_models
from bench.server_process import (
    ServerProcess,
    free_port,
    mlx_lm_server_code,
    radixchat_server_code,
)


@contextmanager
def mlx_folder_and_data(root: Path, model: str, bench: str) -> Iterator[tuple[Path, Path]]:
    """``(mlx_folder, data)`` in a scratch folder removed afterwards: ``model`` of data
    folder ``root`` saved for mlx_lm.server, and a fresh data folder (empty caches) that
    links ``root``'s models."""
    with tempfile.TemporaryDirectory(prefix=f"radixchat-bench-{bench}-") as folder:
        mlx_folder, data = Path(folder) / "mlx", Path(folder) / "data"
        print(
            f"radixchat: bench {bench}: saving the model as an MLX folder for mlx_lm.server",
            file=sys.stderr,
            flush=True,
        )
        save_mlx_folder(root, model, mlx_folder)
        link_models(root, data)
        yield mlx_folder, data


@contextmanager
def ours_and_mlx_lm(
    model: str, data: Path, mlx_folder: Path, pool_tokens: int, stop_timeout_s: float | None = None
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """``radixchat serve`` on ``model`` (data folder ``data``, a pool of ``pool_tokens``)
    and ``mlx_lm.server`` on ``mlx_folder``, each on a free port, both answering; stopped
    afterwards."""
    stop = {} if stop_timeout_s is None else {"stop_timeout_s": stop_timeout_s}
    ours_port, theirs_port = free_port(), free_port()
    with (
        ServerProcess(
            "radixchat serve",
            radixchat_server_code(model, data, ours_port, pool_tokens),
            ours_port,
            **stop,
        ) as ours,
        ServerProcess(
            "mlx_lm.server", mlx_lm_server_code(mlx_folder, theirs_port), theirs_port, **stop
        ) as theirs,
    ):
        yield ours, theirs
