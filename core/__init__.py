"""RadixChat core: engine, model loading, chat store, CLI. Never imports PySide6.

Importing ``core`` arranges for MLX's CPU backend to be prepared (see ``core.cpu_setup``)
right before the first ``import mlx`` anywhere in the process: it has to happen before,
and a command that never imports mlx skips it.
"""

from core.cpu_setup import prepare_before_mlx as _prepare_before_mlx

_prepare_before_mlx()
