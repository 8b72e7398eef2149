"""What the API's layers share while it serves: the engine, the settings, the requests in
flight and the metrics. The routes, the guard and the relay reach it (``request.app.state.api``);
:class:`core.api.server.ApiServer` owns one and runs the HTTP server around it."""

from __future__ import annotations

import threading
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from core import paths
from core.api.errors import ApiError, shutting_down
from core.api.limits import DEFAULT_REQUEST_LIMITS, ByteAllowance, RequestLimits
from core.api.metrics import ServerMetrics
from core.api.request_log import RequestLog
from core.api.responses_room import StoreBudget
from core.api.responses_store import ResponseStore
from core.api.schema_checks import SchemaChecks
from core.api.wire import MODEL_ALIASES, ModelCard
from core.engine import namespaces
from core.engine.engine import Engine, RequestHandle
from core.engine.types import GenerationRequest

# a stream's events waiting for its client past the socket's buffers (core.api.relay)
MAX_UNSENT_EVENTS = 256


def _version() -> str:
    try:
        return version("radixchat")
    except PackageNotFoundError:
        return "dev"


class ApiState:
    """The engine behind the API, its settings, and the requests it is serving now."""

    def __init__(
        self,
        engine: Engine,
        host: str,
        api_keys: tuple[str, ...],
        model_name: str | None,
        max_body_bytes: int,
        allow_origins: tuple[str, ...],
        limits: RequestLimits = DEFAULT_REQUEST_LIMITS,
        aliases: tuple[str, ...] = (),
    ):
        self.engine = engine
        self.aliases = tuple(dict.fromkeys(a for a in aliases if a))  # --alias, listed
        self.host = host
        self.api_keys = tuple(dict.fromkeys(key for key in api_keys if key))  # none: no key asked
        self.model_name = model_name
        self.max_body_bytes = max_body_bytes
        self.allow_origins = allow_origins
        self.limits = limits  # what one request may bring
        # a stream's backlog before its client is cut off
        self.max_unsent_events = MAX_UNSENT_EVENTS
        # what each client's bodies may bring a second
        self.body_bytes = ByteAllowance(burst=max_body_bytes)
        # where a body's schemas are checked (never the event loop)
        self.schema_checks = SchemaChecks()
        self.version = _version()
        self.started_at = int(time.time())
        self._handles: set[RequestHandle] = set()
        self._lock = threading.Lock()
        self.stopping = False
        self.events_waker = None  # core.api.relay's, made on the server's event loop
        self.metrics = ServerMetrics(engine.stats, lambda: len(self._handles))
        self.request_log = RequestLog()  # the last requests, for the app's request log
        self.pulls: set[str] = set()  # models being pulled through /api/pull (by spec)
        # the Responses API's stored responses and conversations (opened on first use): a
        # share of the data folder's disk budget, split evenly between the keys
        owners = tuple(namespaces.owner(self.cache_namespace(key)) for key in self.api_keys)
        budget = StoreBudget(
            paths.stored_responses_budget(engine.disk_budget_bytes),
            owners or (namespaces.owner(self.cache_namespace(None)),),
        )
        self.responses = ResponseStore(paths.responses_db_path(engine.data_root), budget)

    @property
    def api_key(self) -> str | None:
        """The first key (None when the API takes requests without one)."""
        return self.api_keys[0] if self.api_keys else None

    @staticmethod
    def cache_namespace(key: str | None) -> str:
        """The cache namespace of requests made with ``key`` (None: no keys are set)."""
        return namespaces.API if key is None else namespaces.for_key(key)

    def model_card(self, with_cache: bool = False) -> ModelCard:
        """The loaded model; ``with_cache``: with how its prefixes are cached (the model
        list says so; a request need not read the engine's figures for it)."""
        info = self.engine.model_info
        if info is None:
            raise ApiError(
                503, "no model is loaded yet", type="server_error", code="model_not_loaded"
            )
        model_id = self.model_name or info.name
        aliases = {
            model_id,
            info.name,
            info.spec,
            Path(info.path).name,
            *MODEL_ALIASES,
            *self.aliases,
        }
        cached_as = layout = ""
        kv_format = ()
        cache = self.engine.stats().cache if with_cache else None
        if cache is not None:
            cached_as = (
                cache.cached_as if cache.enabled else f"off ({cache.disabled_reason or 'no cache'})"
            )
            layout = cache.layout
            kv_format = cache.kv_formats
        return ModelCard(
            model_id,
            info.fingerprint,
            info.context_length,
            frozenset(aliases),
            self.started_at,
            cached_as,
            layout,
            kv_format,
            tuple(a for a in self.aliases if a != model_id),
            info.base,
        )

    def submit(self, request: GenerationRequest) -> RequestHandle:
        with self._lock:
            if self.stopping:
                raise shutting_down()
            handle = self.engine.submit(request)
            self._handles.add(handle)
        return handle

    def release(self, handle: RequestHandle) -> None:
        with self._lock:
            self._handles.discard(handle)

    def stop_accepting(self) -> list[RequestHandle]:
        """Refuse new requests from now on; the ones still running."""
        with self._lock:
            self.stopping = True
            return list(self._handles)
