"""Work off the GUI thread: run a function on a plain Python thread and get its result (or
its one-line error) back on the GUI thread as queued signals, so the window never waits."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from core.errors import UserError

log = logging.getLogger(__name__)


class Relay(QObject):
    """Carries a worker thread's results to the GUI thread (queued signals). Made on the GUI
    thread; its ``progress`` may be emitted from the worker as it goes."""

    done = Signal(object)
    failed = Signal(str)
    progress = Signal(object)


def run_in_thread(
    work: Callable[[], object], on_done, on_failed, on_progress=None, relay: Relay | None = None
) -> Relay:
    """Run ``work`` on a daemon thread; its result (or a UserError's line) arrives in the
    GUI thread. Keep the returned relay alive until then."""
    relay = relay if relay is not None else Relay()
    relay.done.connect(on_done)
    relay.failed.connect(on_failed)
    if on_progress is not None:
        relay.progress.connect(on_progress)

    def target() -> None:
        try:
            result = work()
        except UserError as exc:
            relay.failed.emit(str(exc))
        except Exception as exc:  # a bug: say so in one line, keep the window alive
            log.exception("a worker failed")
            relay.failed.emit(f"unexpected error: {type(exc).__name__}: {exc}")
        else:
            relay.done.emit(result)

    threading.Thread(target=target, name="radixchat-worker", daemon=True).start()
    return relay
