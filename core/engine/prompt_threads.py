"""The engine's prompt threads: a submitted request's prompt is rendered and tokenised here
(:mod:`core.engine.prompt`), off the engine thread, then the request is handed to the
engine thread carrying its token ids (``handle.tokenized``). A prompt refused here (past
the size limit, empty, tools the template cannot take) ends here: the engine thread never
sees it. No mlx here."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from core.engine.constrain import check_request
from core.engine.handle import RequestHandle, tokenize
from core.engine.prompt import Prompts
from core.engine.types import ErrorEvent
from core.errors import ErrorKind, UserError

log = logging.getLogger(__name__)

# prompts rendered and tokenised at once (a long one does not hold up a short one)
PROMPT_THREADS = 2


class PromptThreads:
    """A small pool of threads that work prompts out; ``hand_on(handle)`` gives each
    request worked out to the engine (its queue's ``put``)."""

    def __init__(self, hand_on: Callable[[RequestHandle], None], threads: int = PROMPT_THREADS):
        self._hand_on = hand_on
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="radixchat-prompt")
        self._lock = threading.Lock()
        self.rendering = 0  # prompts on the threads, not yet handed on (read anywhere)

    def render(self, handle: RequestHandle, prompts: Prompts) -> None:
        """Have a thread work out ``handle``'s prompt for ``prompts``' model, then hand the
        request on. RuntimeError once shut down."""
        with self._lock:
            self.rendering += 1
        try:
            self._pool.submit(self._prepare, handle, prompts)
        except BaseException:
            with self._lock:
                self.rendering -= 1
            raise

    def shutdown(self) -> None:
        """Take no more; the prompts being worked out are handed on first."""
        self._pool.shutdown(wait=True)

    def _prepare(self, handle: RequestHandle, prompts: Prompts) -> None:
        try:
            self.prepare(handle, prompts)
        finally:
            with self._lock:
                self.rendering -= 1

    def prepare(self, handle: RequestHandle, prompts: Prompts) -> None:
        """On a prompt thread: the request's token ids, then the request handed on (or
        ended here, refused)."""
        if not handle.cancelled:  # a cancelled one goes straight on, to end as cancelled
            started = time.perf_counter()
            try:
                check_request(handle.request)  # its tools and schema: here, off the engine thread
                handle.tokenized = tokenize(handle.request, prompts)
                handle.prompt_s = time.perf_counter() - started
            except UserError as exc:
                return _refuse(handle, ErrorEvent(str(exc), exc.kind))
            except MemoryError:
                message = "out of memory: try a shorter prompt"
                return _refuse(handle, ErrorEvent(message, ErrorKind.OUT_OF_MEMORY))
            except Exception as exc:
                log.exception("preparing a prompt failed")
                return _refuse(handle, ErrorEvent(f"internal error: {exc}", ErrorKind.INTERNAL))
        self._hand_on(handle)


def _refuse(handle: RequestHandle, error: ErrorEvent) -> None:
    handle.emit(error)
    handle.finish()
