"""The GUI's one door to the engine: a QObject whose signals carry plain values.

The engine runs on its own thread; the bridge waits on it and reads each request's
events on short-lived Python worker threads, and relays every event to the GUI thread
through a queued signal, so the public signals below are always emitted on the GUI
thread, in order, and never block it.

The signals carry the engine's own values: a finished reply its ``RequestStats`` (and,
just before it, ``toolCalls`` the calls it made, as plain dicts), and
``statsUpdated`` the engine's ``EngineStats`` (frozen dataclasses, safe on any thread). A
timer on the GUI thread reads those figures (the engine thread replaces them; reading them
never waits) 4 times a second while a request or a load runs, and every 1.5 s when idle.

The bridge also owns the in-app API server (``core.api.server.ApiServer``), a second client
of the same engine: ``start_server`` binds and returns its address at once;
``stop_server`` stops it on a worker thread (running API requests are cancelled first,
which can take a moment) and ``serverStopped`` follows.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, QTimer, Signal

from core.api.request_log import LoggedRequest, RequestLog
from core.api.server import ApiServer
from core.engine import namespaces
from core.engine.types import (
    CHAT_PRIORITY,
    ChatMessage,
    DoneEvent,
    ErrorEvent,
    GenerationRequest,
    ProgressEvent,
    ReasoningEvent,
    SamplingParams,
    TokenEvent,
    ToolCall,
)
from core.errors import UserError

if TYPE_CHECKING:
    from core.engine.config import EngineConfig
    from core.engine.engine import Engine, RequestHandle
    from core.models.load.loader import ModelInfo

log = logging.getLogger(__name__)

BUSY_POLL_MS = 250  # live panels while a request or a load runs
_COLLECTING_BRIDGES = [0]  # running bridges: while any, Python's collector runs on the GUI thread


def _collect_on_this_thread() -> None:
    """Collect what automatic collection would now, on the calling (GUI) thread: the
    generations whose counts passed their thresholds (all of them when asked)."""
    counts, thresholds = gc.get_count(), gc.get_threshold()
    for generation in (2, 1, 0):
        if counts[generation] > thresholds[generation]:
            gc.collect(generation)
            return


IDLE_POLL_MS = 1500

_SAMPLING_KEYS = {f.name for f in dataclasses.fields(SamplingParams)}


class EngineBridge(QObject):
    """Owns the engine (one chat request at a time) and the in-app API server."""

    loadProgress = Signal(str, float)  # stage, fraction (-1 when unknown)
    modelLoading = Signal(str)  # the spec being loaded (after start and load_model; "" if unknown)
    modelReady = Signal(str)  # the model's name
    loadFailed = Signal(str)  # one line; the previous model (if any) stays loaded
    progress = Signal(int, int)  # prompt tokens ready (cached or computed), prompt tokens
    token = Signal(str)  # a piece of the reply
    thinking = Signal(str)  # a piece of a reasoning model's thinking (before its reply)
    decoded = Signal(int)  # tokens decoded in that piece (reply or thinking): the live speed
    finished = Signal(str, object)  # the full reply, its RequestStats
    # just before ``finished`` of a reply that called tools: its calls, a tuple of
    # {"id", "name", "arguments" (JSON text)} dicts, in the order the model made them
    toolCalls = Signal(object)
    failed = Signal(str)  # one line
    serverStopped = Signal()  # after stop_server(): the port is free again
    statsUpdated = Signal(object)  # engine.stats(): an EngineStats, polled

    _relay = Signal(str, object)  # (signal name, args): any thread -> the GUI thread

    def __init__(
        self,
        data_root: Path | None = None,
        model_spec: str = "default",
        *,
        engine: Engine | None = None,
        config: EngineConfig | None = None,
        parent: QObject | None = None,
    ):
        """``config``: the engine's configuration (None: its defaults), unless ``engine``
        is given."""
        super().__init__(parent)
        if engine is None:
            from core.engine.engine import Engine  # imported on use: it loads mlx

            engine = Engine(
                Path(data_root), model_spec, config=config, on_load_progress=self._on_load_progress
            )
        self.engine = engine
        self._model_spec = model_spec or ""  # the first model, for modelLoading
        self._handle: RequestHandle | None = None
        self._loading = False
        self._shut_down = False  # after shutdown() the public signals stay silent
        self._server: ApiServer | None = None
        self._server_stopping: threading.Thread | None = None
        self._request_log: RequestLog | None = None
        self._collecting = False  # this bridge turned automatic collection off (start)
        self._relay.connect(self._emit_public, Qt.ConnectionType.QueuedConnection)
        self._poll = QTimer(self)
        self._poll.timeout.connect(self.poll_stats)

    @property
    def busy(self) -> bool:
        """A chat reply is being generated."""
        return self._handle is not None

    @property
    def loading(self) -> bool:
        return self._loading

    @property
    def data_root(self) -> Path:
        """The engine's data folder (models, chats, the disk cache)."""
        return self.engine.data_root

    @property
    def model_info(self) -> ModelInfo | None:
        """The loaded model (None before the first load ends)."""
        return self.engine.model_info

    def forget_session(self, name: str) -> None:
        """Drop a deleted chat's cached KV, in RAM and on disk (queued to the engine thread)."""
        self.engine.forget_session(name, namespaces.APP)

    def give_disk_space_back(self) -> int:
        """The disk is full and a chat turn could not be saved: delete the KV cache's files
        so the history can be (returns the bytes freed; waits for the engine thread)."""
        return self.engine.give_disk_space_back()

    def start(self) -> None:
        """Start the engine; modelLoading, then modelReady or loadFailed.

        From here to ``shutdown`` Python's cyclic collector runs on this (GUI) thread only,
        from the stats timer: a collection on the engine thread (or a request's reader)
        could finalize a Qt object there, and Qt's destructor, holding Qt's signal lock,
        would wait for the GIL that this thread holds while it waits for that lock."""
        if not self._collecting:
            self._collecting = True
            _COLLECTING_BRIDGES[0] += 1
            gc.disable()
        self._loading = True
        self.modelLoading.emit(self._model_spec)
        self.engine.start()
        threading.Thread(target=self._wait_ready, name="radixchat-bridge-load", daemon=True).start()
        self._poll.start(BUSY_POLL_MS)

    def load_model(self, spec: str) -> None:
        """Switch to ``spec``; modelLoading, then modelReady or loadFailed (the previous
        model stays usable after a failure). The engine loads once running requests end."""
        if self._loading:
            raise RuntimeError("a model is already loading")
        self._loading = True
        self.modelLoading.emit(spec)
        self._poll.setInterval(BUSY_POLL_MS)
        threading.Thread(
            target=self._load, args=(spec,), name="radixchat-bridge-load", daemon=True
        ).start()

    def poll_stats(self) -> None:
        """Emit statsUpdated with the engine's latest figures (the timer calls this), and
        collect Python's cycles here, on the GUI thread (see ``start``)."""
        if self._shut_down:
            return
        if self._collecting:
            _collect_on_this_thread()
        try:
            stats = self.engine.stats()
        except Exception:  # a bug: the panels stop, the chat goes on
            log.exception("reading the engine's stats failed")
            self._poll.stop()
            return
        busy = self._loading or self._handle is not None or stats.requests_running > 0
        interval = BUSY_POLL_MS if busy else IDLE_POLL_MS
        if self._poll.interval() != interval:
            self._poll.setInterval(interval)
        self.statsUpdated.emit(stats)

    def send(
        self,
        messages: Sequence[tuple | ChatMessage],
        sampling: dict,
        session: str | None = None,
        *,
        tools: tuple[dict, ...] = (),
        tool_choice: str = "auto",
        tool_name: str | None = None,
    ) -> None:
        """Ask for a reply to ``messages``: the engine's ChatMessages (a tool loop's
        assistant calls and tool results among them: ``ChatTurn.loop_messages``), or
        (role, content) pairs, or (role, content, thinking) for replies of a reasoning
        model; thinking and tokens, then toolCalls (when the reply called tools) and
        finished, or failed. ``sampling`` holds SamplingParams fields (other keys are
        ignored). ``tools`` (OpenAI style), ``tool_choice`` and ``tool_name`` go to the
        engine as GenerationRequest takes them (ValueError for a choice it refuses)."""
        if self._handle is not None:
            raise RuntimeError("a reply is still being generated")
        request = GenerationRequest(
            messages=tuple(_chat_message(m) for m in messages),
            sampling=self.sampling_params(sampling),
            session=session,
            priority=CHAT_PRIORITY,  # a person is watching: ahead of waiting API requests
            cache_namespace=namespaces.APP,  # the chats' own: no API client shares their prefixes
            tools=tuple(tools),
            tool_choice=tool_choice,
            tool_name=tool_name,
        )
        self._handle = self.engine.submit(request)
        self._poll.setInterval(BUSY_POLL_MS)
        threading.Thread(
            target=self._read, args=(self._handle,), name="radixchat-bridge-reply", daemon=True
        ).start()

    @staticmethod
    def sampling_params(sampling: dict) -> SamplingParams:
        """The engine's sampling for a chat's settings dict (other keys are ignored); raises
        ValueError for a bad setting."""
        params = {k: v for k, v in sampling.items() if k in _SAMPLING_KEYS}
        try:
            return SamplingParams(**{**params, "stop": tuple(params.get("stop", ()))})
        except TypeError as exc:  # a value of the wrong type, written by hand
            raise ValueError(str(exc)) from None

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()

    @property
    def server_address(self) -> str | None:
        """``http://127.0.0.1:PORT`` while the API server runs, else None."""
        return self._server.address if self._server is not None else None

    @property
    def server_ollama_address(self) -> str | None:
        """Where the running API server also listens for Ollama's clients, else None."""
        return self._server.ollama_address if self._server is not None else None

    def start_server(
        self,
        port: int = 8000,
        api_keys: tuple[str, ...] = (),
        allow_origins: tuple[str, ...] = (),
        host: str = "127.0.0.1",
        ollama_port: int | None = None,
    ) -> str:
        """Serve the OpenAI-, Anthropic- and Ollama-compatible API on ``host``:``port`` (0:
        any free port) over this bridge's engine, and on ``ollama_port`` too where given,
        asking for one of ``api_keys`` (none: no key; beyond loopback one is needed) and
        answering browsers from ``allow_origins``; returns the address. Raises UserError when
        the port is taken or a setting is refused."""
        if self._server is not None:
            return self._server.address
        if self._server_stopping is not None:  # the previous server may still hold the port
            self._server_stopping.join()
            self._server_stopping = None
        server = ApiServer(
            self.engine,
            host,
            port,
            api_key=api_keys or None,
            allow_origins=allow_origins,
            ollama_port=ollama_port,
        )
        self._server = server.start()
        self._request_log = server.request_log
        return self._server.address

    def recent_requests(self) -> tuple[LoggedRequest, ...]:
        """The last requests the API served, oldest first (kept after it stops, until the
        next start)."""
        return self._request_log.recent() if self._request_log is not None else ()

    def stop_server(self) -> None:
        """Stop the API server off the GUI thread; serverStopped follows. No-op when off."""
        server, self._server = self._server, None
        if server is None:
            return
        self._server_stopping = threading.Thread(
            target=self._stop_server,
            args=(server,),
            name="radixchat-bridge-server-stop",
            daemon=True,
        )
        self._server_stopping.start()

    def shutdown(self) -> None:
        """Cancel the chat reply, stop the API server (waiting for it), then the engine. No
        signal is emitted afterwards (events still on their way are dropped)."""
        self._shut_down = True
        self._poll.stop()
        self.cancel()
        self.stop_server()
        if self._server_stopping is not None:
            self._server_stopping.join()
            self._server_stopping = None
        self.engine.shutdown()
        if self._collecting:
            self._collecting = False
            _COLLECTING_BRIDGES[0] -= 1
            if not _COLLECTING_BRIDGES[0]:
                gc.enable()

    # -- worker threads --

    def _on_load_progress(self, stage: str, fraction: float | None) -> None:  # engine thread
        self._post("loadProgress", stage, -1.0 if fraction is None else float(fraction))

    def _wait_ready(self) -> None:
        try:
            self._post("modelReady", self.engine.wait_ready().name)
        except UserError as exc:
            self._post("loadFailed", str(exc))
        except Exception as exc:  # a bug
            log.exception("waiting for the model failed")
            self._post("loadFailed", f"internal error: {exc}")

    def _load(self, spec: str) -> None:
        try:
            self._post("modelReady", self.engine.load(spec).name)
        except UserError as exc:
            self._post("loadFailed", str(exc))
        except Exception as exc:  # a bug
            log.exception("loading %s failed", spec)
            self._post("loadFailed", f"internal error: {exc}")

    def _read(self, handle: RequestHandle) -> None:
        try:
            for event in handle.events():
                if isinstance(event, TokenEvent):
                    self._post("token", event.text)
                    self._post("decoded", max(1, len(event.token_ids)))
                elif isinstance(event, ReasoningEvent):
                    self._post("thinking", event.text)
                    self._post("decoded", 1)
                elif isinstance(event, ProgressEvent):
                    self._post("progress", event.done, event.total)
                elif isinstance(event, DoneEvent):
                    if event.tool_calls:
                        self._post("toolCalls", tuple(_call_dict(c) for c in event.tool_calls))
                    return self._post("finished", event.text, event.stats)
                elif isinstance(event, ErrorEvent):
                    return self._post("failed", event.message)
            self._post("failed", "the engine ended the reply without a result")
        except Exception as exc:  # a bug
            log.exception("reading the reply failed")
            self._post("failed", f"internal error: {exc}")

    def _stop_server(self, server: ApiServer) -> None:
        try:
            server.stop()
        except Exception:  # a bug: the port may stay taken until the app exits
            log.exception("stopping the API server failed")
        self._post("serverStopped")

    def _post(self, name: str, *args: object) -> None:
        self._relay.emit(name, args)

    # -- GUI thread --

    def _emit_public(self, name: str, args: tuple) -> None:
        if name in ("finished", "failed"):
            self._handle = None
        elif name in ("modelReady", "loadFailed"):
            self._loading = False
            if self._collecting:  # a switched-from model's cycles: freed now, here
                gc.collect()
        if self._shut_down:
            return
        getattr(self, name).emit(*args)
        if name in ("finished", "failed", "modelReady", "loadFailed"):
            self.poll_stats()  # the panels see the turn's or the load's figures at once


def _chat_message(message: tuple | ChatMessage) -> ChatMessage:
    """One message to send: a ChatMessage as it is, or (role, content[, thinking])."""
    if isinstance(message, ChatMessage):
        return message
    role, content, *thought = message
    return ChatMessage(role, content, reasoning=(thought[0] or "") if thought else "")


def _call_dict(call: ToolCall) -> dict:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}
