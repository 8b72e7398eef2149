"""RadixChat core: engine, model loading, chat store, CLI. Never imports PySide6.

Importing ``core`` first prepares MLX's CPU backend (see ``core.cpu_setup``): it has to
happen before the first ``import mlx`` anywhere in the process.
"""

from core.cpu_setup import prepare_cpu_backend as _prepare_cpu_backend

_prepare_cpu_backend()
