"""An API server as a subprocess for a benchmark: ours (``radixchat serve``) or
``mlx_lm.server``, started on a free loopback port, waited for, and stopped.

Both start with ``import core`` before anything imports mlx, so both get the CPU setup
of :mod:`core.cpu_setup` (the system OpenBLAS preloaded): the figures compare servers,
not BLAS libraries. Clients in the benchmark's own process then share no interpreter
(and no GIL) with either server.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.errors import UserError

START_TIMEOUT_S = 300
REPO_ROOT = Path(__file__).resolve().parents[1]


def wait_until_answers(
    process, port: int, path: str, timeout_s: float, host: str = "127.0.0.1"
) -> bool:
    """Poll ``GET path`` on ``host:port`` every half second until it answers 200 (True), or
    ``process`` exits or ``timeout_s`` passes (False: the caller says which, in its words)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        conn = http.client.HTTPConnection(host, port, timeout=5)
        try:
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return True
        except OSError:
            pass  # not listening yet
        finally:
            conn.close()
        time.sleep(0.5)
    return False


def free_port(span: int = 1) -> int:
    """A free port on 127.0.0.1, with ``span - 1`` free ports after it (MLX's ring takes
    one per rank)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + span > 65536:
            continue
        try:
            for port in range(base + 1, base + span):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise UserError("no free ports on 127.0.0.1")


def mlx_lm_server_code(folder: Path, port: int) -> str:
    """Python code that runs ``mlx_lm.server`` on MLX folder ``folder`` after ``import core``."""
    return (
        "import core, sys; from mlx_lm.server import main; "
        f"sys.argv = ['mlx_lm.server', '--model', {str(folder)!r}, '--host', '127.0.0.1', "
        f"'--port', '{port}', '--log-level', 'WARNING']; main()"
    )


def radixchat_server_code(
    model: str,
    data_dir: Path,
    port: int,
    kv_tokens: int,
    *,
    use_cache: bool = True,
    chat_template: str | None = None,
    extra: list[str] | tuple[str, ...] = (),
) -> str:
    """Python code that runs ``radixchat serve`` (our API over our engine); without its
    cache (``--no-cache``) or with another chat template when asked, ``extra`` arguments last."""
    argv = [
        "serve",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--kv-tokens",
        str(kv_tokens),
        *extra,
    ]
    if chat_template:
        argv += ["--chat-template", str(chat_template)]
    if not use_cache:
        argv.append("--no-cache")
    return f"import core, sys; from core.cli.main import main; sys.exit(main({argv!r}))"


class ServerProcess:
    """``python -c code`` serving on 127.0.0.1:``port``; ready once ``GET ready_path``
    answers 200 (``/health`` for a server that asks for a key). Use as a context manager
    (or :meth:`start` and :meth:`stop`): it is terminated on exit, and killed if it has not
    ended ``stop_timeout_s`` later."""

    def __init__(
        self,
        name: str,
        code: str,
        port: int,
        stop_timeout_s: float = 30,
        ready_path: str = "/v1/models",
    ):
        self.name, self.code, self.port, self.stop_timeout_s = name, code, port, stop_timeout_s
        self.ready_path = ready_path
        self.host = "127.0.0.1"
        self._log = None
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> ServerProcess:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [sys.executable, "-c", self.code], env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (None once stopped)."""
        return self._process.pid if self._process is not None else None

    def output(self) -> str:
        """What the server has printed so far (stdout and stderr; empty once stopped)."""
        if self._log is None:
            return ""
        fd = self._log.fileno()  # read in place: the server writes at the file's shared offset
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def stop(self) -> int | None:
        """Terminate the server (SIGTERM: it shuts down cleanly), killed if it has not ended
        ``stop_timeout_s`` later; its exit status (negative: the signal that ended it; None:
        it was not running)."""
        status = None
        if self._process is not None:
            self._process.terminate()
            try:
                status = self._process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                status = self._process.wait()
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        return status

    def _wait_ready(self) -> None:
        if wait_until_answers(
            self._process, self.port, self.ready_path, START_TIMEOUT_S, self.host
        ):
            return
        if self._process.poll() is not None:
            self._log.seek(0)
            last = self._log.read().decode(errors="replace").strip().splitlines()[-1:]
            raise UserError(f"{self.name} exited with {self._process.returncode}: {' '.join(last)}")
        raise UserError(f"{self.name} did not answer within {START_TIMEOUT_S} s")
