"""Serving a model over several machines from a front end that is not the command line
(the app's Serve settings): check a hostfile against a model, then run ``radixchat serve
--hosts`` as a child process and watch it.

:func:`check_group` says, before anything starts, which hosts a hostfile names and whether
the model splits over them (:func:`core.distributed.shard.split_plan`: the model's config
only, no weights). :class:`GroupServer` starts the group and reports what becomes of it
through one callback, ``on_event(kind, text)``, with plain strings, from its own thread:

- ``"line"``: a line the group printed (its log);
- ``"serving"``: the API answers; the text is its address (``http://HOST:PORT/v1``);
- ``"fault"``: a rank died, could not be reached or failed; the text names it and its host;
- ``"ended"``: the group's process is gone; the text is empty after a clean stop, else the
  one-line reason (the fault, or the error that kept the group from starting).

:meth:`GroupServer.stop` stops it as Ctrl-C does (rank 0 stops every rank in order, each
flushing its disk cache), and kills what is left after ``STOP_S``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.distributed.launch import radixchat_command, read_hostfile
from core.distributed.outcome import ENDED_PREFIX, fault_of, plain
from core.errors import UserError

STOP_S = 60.0  # a group that has not stopped this long after the stop is killed
_SERVING = re.compile(r"^radixchat: serving .* at (\S+) \(Ctrl-C to stop\)")
_ERROR_PREFIX = "radixchat: error: "


@dataclass(frozen=True)
class GroupCheck:
    """What a hostfile names and whether a model splits over it (plain values)."""

    hosts: tuple[str, ...]  # "ssh name (ips)", rank by rank
    splits: bool
    summary: str  # one line: the split, or why not (a bad hostfile, a model it cannot split)


def check_group(hostfile: str, model_path: str) -> GroupCheck:
    """Read ``hostfile`` and the config of the model at ``model_path``; never raises a
    :class:`UserError` (its line becomes the summary). Reads files: call it off the GUI thread."""
    from core.distributed.shard import PIPELINE, model_config, split_plan

    try:
        hosts = read_hostfile(hostfile)
    except UserError as exc:
        return GroupCheck((), False, str(exc))
    names = tuple(f"{h.ssh} ({', '.join(h.ips)})" for h in hosts)
    path = Path(model_path)
    try:
        plan = split_plan(model_config(path), len(hosts), path.name)
    except UserError as exc:
        return GroupCheck(names, False, str(exc))
    share = (
        plan.describe()
        if plan.method == PIPELINE
        else f"{plan.kv_heads // plan.world} of its {plan.kv_heads} KV heads on each"
    )
    return GroupCheck(names, True, f"{path.name} splits over {len(hosts)} hosts: {share}")


class GroupServer:
    """``radixchat serve --hosts HOSTFILE --model MODEL`` as a child process, watched."""

    def __init__(
        self,
        hostfile: str,
        model: str,
        port: int,
        data_dir: str,
        on_event: Callable[[str, str], None],
        extra_args: tuple[str, ...] = (),
    ):
        self.command = [
            *radixchat_command(),
            "serve",
            "--hosts",
            hostfile,
            "--model",
            model,
            "--port",
            str(port),
            "--data-dir",
            data_dir,
            *extra_args,
        ]
        self._on_event = on_event
        self._process: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the group (returns at once; events follow from the watching thread)."""
        # stdin stays an open pipe: MLX's launcher polls its stdin (/dev/null would spin it);
        # a session of its own, so that stop() reaches every process of the group
        self._process = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._watcher = threading.Thread(
            target=self._watch, name="radixchat-group-watch", daemon=True
        )
        self._watcher.start()

    def stop(self) -> None:
        """Stop the group as Ctrl-C would (returns at once; "ended" follows)."""
        if self._process is None or self._stopping.is_set():
            return
        self._stopping.set()
        self._signal(signal.SIGINT)
        threading.Thread(target=self._kill_after, name="radixchat-group-stop", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Until the watcher has reported "ended" (True), or ``timeout`` passed (False)."""
        if self._watcher is None:
            return True
        self._watcher.join(timeout)
        return not self._watcher.is_alive()

    def _signal(self, signum: int) -> None:
        try:
            os.killpg(self._process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _kill_after(self) -> None:
        try:
            self._process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)

    def _watch(self) -> None:
        process = self._process
        last_lines: deque[str] = deque(maxlen=20)
        fault = error = None
        for raw in iter(process.stdout.readline, b""):
            # a progress bar's last state
            line = plain(raw.decode(errors="replace")).rstrip().rsplit("\r", 1)[-1]
            last_lines.append(line)
            self._on_event("line", line)
            serving = _SERVING.match(line)
            if serving:
                self._on_event("serving", serving.group(1))
            found = fault_of(line) or (
                line[len(ENDED_PREFIX) :] if line.startswith(ENDED_PREFIX) else None
            )
            if found and fault is None:
                fault = found
                self._on_event("fault", fault)
            if line.startswith(_ERROR_PREFIX) and error is None:
                error = line[len(_ERROR_PREFIX) :]
        code = process.wait()
        if process.stdin is not None:
            process.stdin.close()
        process.stdout.close()
        if code == 0 or (self._stopping.is_set() and fault is None and error is None):
            reason = ""
        else:
            reason = (
                fault
                or error
                or next(
                    (x for x in reversed(last_lines) if x.startswith("radixchat:")),
                    f"the group's server exited with code {code}",
                )
            )
        self._on_event("ended", reason)
