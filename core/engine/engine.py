"""The engine: one thread that owns the model and every MLX call.

Clients (CLI, GUI bridge, HTTP server) submit :class:`GenerationRequest` values and
read a stream of events back; only plain values cross the thread boundary. The engine
loads its model inside its own thread (MLX streams are per thread), prefills requests
a chunk at a time between the decode steps of the running requests, which it decodes
together (``core.engine.scheduler``), and checks each request's cancel flag between
prefill chunks and between decode steps.

A submitted request's prompt is rendered and tokenised first on one of the engine's
prompt threads (``core.engine.prompt_threads``; the tokenizer is not MLX), where a prompt
past the size limit ends at once; the engine thread takes the request on carrying its
token ids, so rendering and tokenising never hold up the streams it is decoding.

    engine = Engine(data_root, "default", config=EngineConfig(pool_tokens=4096))
    engine.start()
    for event in engine.stream(request):
        ...
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from core import paths
from core.engine.commands import (
    WHEN_IDLE,
    EmbedCommand,
    FlushCommand,
    ForgetCommand,
    GiveWayCommand,
    LoadCommand,
    StopCommand,
)
from core.engine.config import EngineConfig
from core.engine.embedding_inputs import embedding_tokens
from core.engine.engine_stats import EngineStats, process_rss
from core.engine.handle import RequestHandle
from core.engine.prompt import PromptLimit, Prompts
from core.engine.prompt_threads import PromptThreads
from core.engine.template_facts import TemplateFacts
from core.engine.types import (
    DoneEvent,
    EmbeddingRequest,
    EmbeddingResult,
    ErrorEvent,
    Event,
    GenerationRequest,
    RequestStats,
)
from core.errors import ErrorKind, ModelLoadError, UserError
from core.models.derived import derived_bytes

if TYPE_CHECKING:  # core.models.load.loader imports mlx: only the engine thread loads it
    from core.models.load.loader import ModelInfo

log = logging.getLogger(__name__)

PUBLISH_EVERY_S = 0.1  # the decode loop's stats refresh (see Engine._publish_stats)
# Nobody decoding and prompts still being rendered: the engine waits up to this long for
# them before it starts a prefill, so that requests sent together are prefilled together
# (core.engine.batch_prefill) instead of the first alone and the others after it.
GATHER_S = 0.05


class Engine:
    """Owns the model and all MLX work on one thread for the life of the app.

    ``config``: what it is set up with besides the model (:class:`EngineConfig`);
    ``weights_format`` the first model's (``auto``, ``stored``, ``float16``...);
    ``on_load_progress(stage, fraction)`` hears how loading goes (any thread).

    A subclass runs it otherwise (:class:`core.distributed.engine.ShardedEngine`: one rank
    of a group) through these engine-thread hooks, and no others: :meth:`run` (the thread's
    loop), :meth:`load_model`, :meth:`install`, :meth:`admit` and :meth:`before_park`. What
    each command does is :meth:`apply`'s table, the same for both."""

    def __init__(
        self,
        data_root: Path,
        model_spec: str | None = "default",
        *,
        config: EngineConfig | None = None,
        weights_format: str = "auto",
        on_load_progress: Callable[[str, float | None], None] | None = None,
    ):
        self.data_root = Path(data_root)
        self.config = config or EngineConfig()
        # the disk cache's database (None: the data folder's; a rank of a group has its own)
        path = self.config.kv_cache_path
        self._kv_db = Path(path) if path else paths.kv_cache_db_path(data_root)
        # the loaded model's (set on the engine thread, read anywhere)
        self._prompts: Prompts | None = None
        self._loads = 0  # models installed so far: a prompt is worked out for one of them
        self._gather_since: float | None = None  # engine thread: when it began waiting for them
        self._initial = (model_spec, weights_format)
        self._derived_bytes = 0  # the data folder's derived files, measured at each load
        self._responses_bytes = 0  # what the stored responses may take, measured at each load
        self.disk_cache_error: str | None = None  # why the disk cache is off, if it is
        self._stats = EngineStats()
        self._served = 0
        self._published_at = 0.0
        self._stats_wanted = True  # stats() was called since the last refresh (see _publish_stats)
        self._on_load_progress = on_load_progress
        self._commands: queue.Queue = queue.Queue()
        self._prompt_threads = PromptThreads(self._commands.put)  # they hand requests on
        self._thread: threading.Thread | None = None
        self._loaded = None  # LoadedModel, engine thread only
        self._cache = None  # kvcache.tiered.TieredCache (RAM and disk), engine thread only
        self._scheduler = None  # core.engine.scheduler.Scheduler, engine thread only
        self._info: ModelInfo | None = None
        self._load_error: str | None = None
        self._ready, self._stopped = threading.Event(), threading.Event()

    # ------------------------------------------------------------ client API
    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name="radixchat-engine", daemon=True)
            self._thread.start()
            spec, fmt = self._initial
            if spec is not None:
                self._commands.put(LoadCommand(spec, fmt))
            else:
                self._ready.set()
        return self

    def wait_ready(self, timeout: float | None = None) -> ModelInfo:
        """Block until the first model is loaded; raise UserError if it failed."""
        if not self._ready.wait(timeout):
            raise TimeoutError("the model is still loading")
        if self._info is None:
            raise UserError(self._load_error or "no model loaded")
        return self._info

    @property
    def model_info(self) -> ModelInfo | None:
        return self._info

    def stats(self) -> EngineStats:
        """The latest figures: the engine thread updates the model, cache and MLX figures
        after each load, prefill chunk and decode step; process RSS and the disk cache's
        size are read now. Cheap enough to poll a few times a second from a GUI. While
        requests run, the figures are refreshed only once someone has asked for them (this
        call asks), at most every ``PUBLISH_EVERY_S``: a poll sees them as of its last poll
        or later, and a server nobody polls spends nothing on them."""
        self._stats_wanted = True
        tier = self._cache.disk if self._cache is not None else None
        disk = paths.database_bytes(self._kv_db) if tier is not None else 0
        budget = self._kv_disk_budget() if tier is not None else 0
        return replace(
            self._stats,
            rss_bytes=process_rss(),
            disk_cache_bytes=disk,
            disk_cache_budget_bytes=budget,
            derived_bytes=self._derived_bytes,
            disk=tier.stats() if tier is not None else None,
        )

    def load(
        self, spec: str, weights_format: str = "auto", timeout: float | None = None
    ) -> ModelInfo:
        """Switch models. On failure the previous model stays loaded and UserError is raised."""
        command = LoadCommand(spec, weights_format)
        self._commands.put(command)
        command.done.wait(timeout)
        if command.error is not None:
            raise UserError(command.error)
        assert command.info is not None
        return command.info

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue ``request``; its events come through the handle. Returns at once: the
        prompt is rendered and tokenised on a prompt thread, then the engine takes it on."""
        handle = RequestHandle(request)
        prompts = self._prompts
        if prompts is None:  # no model yet (the first may be loading): the engine thread decides
            self._commands.put(handle)
        else:
            try:
                self._prompt_threads.render(handle, prompts)
            except RuntimeError:  # shut down: queued as before, never to be served
                self._commands.put(handle)
        return handle

    def stream(self, request: GenerationRequest) -> Iterator[Event]:
        """Submit and iterate; closing the iterator early cancels the request."""
        handle = self.submit(request)
        try:
            yield from handle.events()
        finally:
            handle.cancel()

    def count_tokens(self, request: GenerationRequest, timeout: float | None = 60.0) -> int:
        """How many tokens ``request``'s prompt is (chat template applied), without running
        it, worked out on the calling thread (``timeout``: for the first model to load).
        Raises UserError (a ModelLoadError when no model is loaded; a ContextLengthError
        for a text too long to fit, which is not tokenised); anything else is a bug."""
        self._ready.wait(timeout)
        prompts = self._prompts
        if prompts is None:
            raise ModelLoadError(self._load_error or "no model is loaded")
        try:
            return prompts.count(request)
        except UserError:
            raise
        except Exception as exc:  # a bug: logged in full, raised to the caller
            log.exception("counting tokens failed")
            raise RuntimeError(f"counting tokens failed: {exc}") from exc

    def template_facts(self) -> TemplateFacts | None:
        """The loaded model's chat template and tokenizer, described (worked out once per
        load, on the calling thread); None while no model is loaded."""
        prompts = self._prompts
        return prompts.facts if prompts is not None else None

    def embed(self, request: EmbeddingRequest, timeout: float | None = 60.0) -> EmbeddingResult:
        """``request``'s vectors from the loaded model (:mod:`core.engine.embedding`): token
        ids worked out on the calling thread, the forward passes on the engine thread
        between decode steps. Blocks (``timeout``: for the first model to load). Raises
        UserError (a ModelLoadError when no model is loaded, a ContextLengthError for an
        input too long); anything else is a bug."""
        self._ready.wait(timeout)
        prompts = self._prompts
        if prompts is None:
            raise ModelLoadError(self._load_error or "no model is loaded")
        command = EmbedCommand(request, embedding_tokens(prompts, request), prompts.load)
        self._commands.put(command)
        return command.answer(self._stopped)

    def forget_session(self, session: str, namespace: str = "") -> None:
        """Drop the cache of ``session`` of cache namespace ``namespace`` (the chat was
        deleted): its lock on RAM pages at once, its disk cache soon after, off the
        caller's thread. Shared pages stay."""
        self._commands.put(ForgetCommand(session, namespace))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Finish the requests submitted so far, drop the model and the cache, park the thread."""
        self._prompt_threads.shutdown()  # the prompts being worked out reach the queue first
        if self._thread is not None:
            self._commands.put(StopCommand())
            self._stopped.wait(timeout)
            self._thread = None

    # ------------------------------------------------------------ engine thread
    def run(self) -> None:
        """The engine thread (:meth:`start` starts it): take each command off the queue and
        :meth:`apply` it, stepping the running requests between commands. A group's engine
        runs its ranks' loop instead, applying the commands through the same table."""
        deferred: list = []  # loads and stops wait until the running requests are done
        while True:
            if self._cache is not None:  # the pages of replies just sent, for the disk
                self._cache.serialize_pending()
            busy = self._scheduler is not None and self._scheduler.busy
            gather = busy and self._gathering()
            if busy or not deferred:
                try:
                    command = self._commands.get(
                        block=not busy or gather,
                        timeout=max(0.0, self._gather_since + GATHER_S - time.monotonic())
                        if gather
                        else None,
                    )
                except queue.Empty:
                    command = None
            else:
                command = deferred.pop(0)
            if busy and isinstance(command, WHEN_IDLE):
                deferred.append(command)
            elif command is not None:
                self.apply(command)
                # a request: take every waiting one in before the next step (the scheduler
                # picks among them by priority), and those still being rendered, briefly
                if isinstance(command, RequestHandle) and (
                    not self._commands.empty()
                    or (self._scheduler is not None and self._gathering())
                ):
                    continue
            if self._scheduler is not None and self._scheduler.busy:
                self._step()

    # ------------------------------------------------------------ the command table
    @functools.singledispatchmethod
    def apply(self, command) -> None:
        """Carry out one command off the queue (engine thread): a request's handle or one of
        :mod:`core.engine.commands`, by its type's handler below (the one table of what
        each does, for this engine and a group's ranks alike)."""
        raise TypeError(f"not an engine command: {command!r}")

    @apply.register
    def _apply_request(self, handle: RequestHandle) -> None:
        self.admit(handle)

    @apply.register
    def _apply_embed(self, command: EmbedCommand) -> None:
        from core.engine.embedding import advance

        ram = self._cache.ram if self._cache is not None else None  # embeddings: RAM only
        if not advance(command, self._loaded, ram, self._prompts):
            self._commands.put(command)  # its next forward pass: after the next decode step

    @apply.register
    def _apply_forget(self, command: ForgetCommand) -> None:
        self._forget(command.session, command.namespace)

    @apply.register
    def _apply_flush(self, command: FlushCommand) -> None:
        if self._cache is not None:
            self._cache.flush()
        command.done.set()

    @apply.register
    def _apply_give_way(self, command: GiveWayCommand) -> None:
        command.freed = self._give_way()
        command.done.set()

    @apply.register
    def _apply_load(self, command: LoadCommand) -> None:
        self._do_load(command)

    @apply.register
    def _apply_stop(self, command: StopCommand) -> None:
        self._close_cache()
        self._loaded = self._scheduler = self._prompts = None
        self.before_park()
        self._park()

    def before_park(self) -> None:
        """Stopping, the cache closed, before the engine thread parks (engine thread): a
        group's ranks wait for each other here."""

    def _gathering(self) -> bool:
        """Whether to wait for the prompts still being rendered before the next step:
        nobody decodes, the waiting requests have not started, and it is less than
        ``GATHER_S`` since the wait began (a long prompt's rendering is not waited for)."""
        s = self._scheduler
        if (
            not s.prefill.batch_prefill
            or s.decoding
            or not self._prompt_threads.rendering
            or any(job.run is not None for job in s.waiting)
        ):
            self._gather_since = None
            return False
        now = time.monotonic()
        if self._gather_since is None:
            self._gather_since = now
        return now - self._gather_since < GATHER_S

    def _step(self) -> None:
        self._gather_since = None
        try:
            self._scheduler.step()
        except Exception as exc:  # a bug: end the running requests, keep the engine
            log.exception("decode step failed")
            self._scheduler.fail_all(f"internal error: {exc}")
        self._publish_stats(force=not self._scheduler.busy)  # the last step's figures always

    def _disk_settings(self, fingerprint: str):
        """Where the loaded model's disk tier keeps its pages (None: no disk cache)."""
        from kvcache.persist import MIN_WRITE_TOKENS
        from kvcache.tiered import DiskSettings

        config = self.config
        if not (config.disk_cache and config.use_cache):
            return None
        return DiskSettings(
            self._kv_db,
            fingerprint,
            self._kv_disk_budget(),
            MIN_WRITE_TOKENS if config.disk_min_tokens is None else config.disk_min_tokens,
        )

    @property
    def disk_budget_bytes(self) -> int:
        """The data folder's disk budget (chosen, or the default): the disk cache, the files
        made from models and the API's stored responses together."""
        return self.config.disk_budget_bytes or paths.default_disk_budget()

    def _kv_disk_budget(self) -> int:
        """The disk budget less what the models' derived files take (a tokenizer, a kept
        conversion: ``core.models.derived``) and what the API's stored responses may take
        (``paths.stored_responses_bytes``), down to a quarter of it at least."""
        budget = self.disk_budget_bytes
        return max(budget - self._derived_bytes - self._responses_bytes, budget // 4)

    def _forget(self, session: str, namespace: str) -> None:
        if self._cache is not None:
            self._cache.forget_session(session, namespace)
        elif self.config.disk_cache:  # no model loaded: what it saved is on disk all the same
            from kvcache.tiered import forget_stored_session

            forget_stored_session(self._kv_db, session, namespace)

    def _close_cache(self) -> None:
        if self._cache is not None:
            self._cache.close()
            self._cache = None

    def give_disk_space_back(self, timeout: float = 30.0) -> int:
        """The chat history could not be written because the disk is full: the history wins.
        Close the disk cache, delete its files (deleting needs no free space, unlike any
        write) and start a new, empty one. Returns the bytes freed (0: nothing to free)."""
        if self._thread is None:  # not started, or shut down: nothing holds the cache open
            return self._give_way()
        command = GiveWayCommand()
        self._commands.put(command)
        command.done.wait(timeout)
        return command.freed

    def _give_way(self) -> int:
        from kvcache.sqlite_file import remove_files

        if not self.config.disk_cache:
            return 0
        freed = self._cache.give_way() if self._cache is not None else remove_files(self._kv_db)
        log.warning(
            "the disk is full: the KV cache (%.1f MB) was deleted to save the chat history",
            freed / 1e6,
        )
        return freed

    def flush_disk_cache(self, timeout: float = 30.0) -> None:
        """Wait until the sessions saved so far are on disk (tests, benchmarks)."""
        command = FlushCommand()
        self._commands.put(command)
        command.done.wait(timeout)

    def _park(self) -> None:
        """Never return. A thread that used MLX runs MLX's thread-local destructors when it
        exits, and they take the GIL: if the interpreter is finalizing by then (the main
        thread only waits for the Python side of a thread), the process aborts
        ("terminate called without an active exception"). A parked daemon thread simply
        ends with the process, so shutdown parks the engine thread instead of ending it."""
        import gc

        gc.collect()  # free the model's arrays now, on this thread
        self._stopped.set()
        threading.Event().wait()

    def load_model(self, spec: str, weights_format: str, shard=None, parts: int = 1):
        """The LoadedModel for ``spec`` (engine thread). A rank of a group loads its part:
        ``shard`` and ``parts`` as :func:`core.models.load.loader.load_model` takes them (no
        CPU speed-ups then: not tried on a group)."""
        from core.engine import cpu_speedups
        from core.models.load.loader import load_model

        loaded = load_model(
            spec,
            self.data_root,
            weights_format,
            self._on_load_progress,
            chat_template=self.config.chat_template,
            shard=shard,
            parts=parts,
        )
        if shard is None and cpu_speedups.wanted():
            done = cpu_speedups.apply(loaded.model)
            log.info("CPU backend: %s", "; ".join(done) or "no speed-up applies to this model")
        return loaded

    def _do_load(self, command: LoadCommand) -> None:
        """Load ``command.spec`` in place of the current model, which goes first (two models
        never share memory); if the new one cannot be loaded, the previous one is loaded back."""
        previous = self._info
        if previous is not None:
            command.error = self._missing(command.spec)  # then nothing changes
            if command.error is not None:
                return self._done_loading(command)
            self._drop_model()
        command.error = self._load_and_install(command)
        if command.error is not None and previous is not None:
            back = LoadCommand(previous.spec, previous.weights_format)
            if self._load_and_install(back) is not None:
                log.error("the previous model %s did not load again: %s", previous.spec, back.error)
        self._done_loading(command)

    def _done_loading(self, command: LoadCommand) -> None:
        if self._info is None:
            self._load_error = command.error
        self._ready.set()
        command.done.set()

    def _missing(self, spec: str) -> str | None:
        """Why ``spec`` names no model on this machine (a known one is fetched), else None."""
        from core.models.load.loader import resolve_spec

        try:
            resolve_spec(spec, self.data_root, self._on_load_progress)
        except UserError as exc:
            return str(exc)
        return None

    def _load_and_install(self, command: LoadCommand) -> str | None:
        """None once ``command``'s model is the engine's, else one line for the user."""
        try:
            loaded = self.load_model(command.spec, command.weights_format)
        except UserError as exc:
            command.error = str(exc)
            return command.error
        except Exception as exc:  # a bug: keep the engine alive, report one line
            log.exception("loading %s failed", command.spec)
            command.error = f"loading {command.spec} failed: {exc}"
            return command.error
        try:
            self.install(loaded, command)
        except Exception as exc:  # out of memory for the pool, a bug...
            log.exception("setting up %s failed", command.spec)
            del loaded
            self._drop_model()  # its writer thread and connections, if it got that far
            command.error = f"setting up {command.spec} failed: {exc}"
            return command.error
        from core.engine.memory import give_memory_back

        give_memory_back()  # what loading left behind (temporary buffers)
        return None

    def _drop_model(self) -> None:
        """Let the model, its pool, tree and disk tier go, and their memory back."""
        self._close_cache()
        self._loaded = self._scheduler = self._prompts = None
        self._info = None
        self._publish_stats()
        from core.engine.memory import give_memory_back

        give_memory_back()

    def install(self, loaded, command: LoadCommand) -> None:
        """Make ``loaded`` the engine's model (engine thread): its pool, tree, disk tier,
        scheduler and prompts; ``command.info`` set. A group's ranks agree on the pool first."""
        from core.engine.drafts import draft_model
        from core.engine.scheduler import Scheduler
        from kvcache.builder import DEFAULT_PAGE_SIZE, build_kv_cache
        from kvcache.tiered import TieredCache

        self._derived_bytes = derived_bytes(self.data_root)  # counted against the disk budget
        self._responses_bytes = paths.stored_responses_bytes(self.data_root, self.disk_budget_bytes)
        config = self.config
        build = build_kv_cache(
            loaded.model,
            weight_bytes=loaded.info.weight_bytes,
            page_size=config.page_size or DEFAULT_PAGE_SIZE,
            pool_tokens=config.pool_tokens,
            pool_bytes=config.pool_bytes,
            disable=not config.use_cache,
            kv_format=config.kv_format,
            # None: the builder's segments; 0: the whole pool at once
            **(
                {}
                if config.pool_segment_bytes is None
                else {"segment_bytes": config.pool_segment_bytes or None}
            ),
        )
        self._loaded = loaded
        self._cache = TieredCache(loaded.model, build, self._disk_settings(loaded.info.fingerprint))
        self.disk_cache_error = self._cache.disk_error  # the app runs on without a disk cache
        self._scheduler = Scheduler(
            loaded,
            self._cache,
            self._count_served,
            on_progress=lambda: self._publish_stats(force=False),
            speculative=config.speculation.mode,
            draft_model=draft_model(config.speculation.draft_model, self.data_root, loaded),
            sharing=config.prefill_sharing,
        )
        self._info = loaded.info
        self._loads += 1
        self._prompts = Prompts(
            loaded.tokenizer,
            PromptLimit(loaded.info.name, loaded.info.context_length, config.max_prompt_tokens),
            self._loads,
        )
        command.info = loaded.info
        self._publish_stats()

    def admit(self, handle: RequestHandle) -> None:
        """Take a request on (engine thread): it waits its turn to prefill, then decodes
        with the others. A group's ranks work its prompt out here first, in step."""
        try:
            if handle.cancelled:
                handle.emit(DoneEvent("", RequestStats(finish_reason="cancelled")))
            elif self._scheduler is None:
                handle.emit(
                    ErrorEvent(self._load_error or "no model is loaded", ErrorKind.MODEL_NOT_LOADED)
                )
            elif handle.tokenized is None or handle.tokenized.load != self._prompts.load:
                # submitted before this model was in: its prompt is worked out for this one
                self._prompt_threads.render(handle, self._prompts)
                return
            else:
                self._scheduler.admit(handle)  # finishes the handle itself, now or later
                return
        except UserError as exc:
            handle.emit(ErrorEvent(str(exc), exc.kind))
        except MemoryError:
            handle.emit(
                ErrorEvent(
                    "out of memory: try a shorter prompt or a smaller model",
                    ErrorKind.OUT_OF_MEMORY,
                )
            )
        except Exception as exc:
            log.exception("request failed")
            handle.emit(ErrorEvent(f"internal error: {exc}", ErrorKind.INTERNAL))
        handle.finish()
        self._count_served()

    def _count_served(self) -> None:
        self._served += 1
        # the figures once nothing runs; while others still decode, the next refresh has them
        self._publish_stats(force=self._scheduler is None or not self._scheduler.busy)

    def _publish_stats(self, force: bool = True) -> None:
        """Replace the figures ``stats()`` hands out. From the decode loop and prefill chunks
        (``force=False``) only when they were asked for since the last time, and at most
        every ``PUBLISH_EVERY_S``: the tree census walks every cached token (holding the GIL
        the decode step needs; its cost: docs/benchmarks.md), and the GUI polls 4 times a
        second."""
        import mlx.core as mx

        now = time.monotonic()
        if not force and (not self._stats_wanted or now - self._published_at < PUBLISH_EVERY_S):
            return
        self._published_at = now
        self._stats_wanted = False
        cache = self._cache.stats() if self._cache is not None else None
        self._stats = EngineStats(
            model=self._info,
            cache=cache,
            mlx_active_bytes=mx.get_active_memory(),
            mlx_cache_bytes=mx.get_cache_memory(),
            mlx_peak_bytes=mx.get_peak_memory(),
            requests_served=self._served,
            requests_running=self._scheduler.running if self._scheduler is not None else 0,
        )
