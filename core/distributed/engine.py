"""The engine of one rank of a group: rank 0 decides, every rank computes.

Every rank runs the ordinary engine (:class:`core.engine.engine.Engine`: scheduler, prefix
cache, disk tier) on its shard of the model; the forward passes meet in MLX's collectives.
For the collectives to pair up, every rank must run the same steps in the same order, so
only rank 0 decides anything that depends on time or on its clients:

- Rank 0's engine loop turns each iteration into a *tick*: the command it takes this turn
  (a request, with its id; or one of :mod:`core.engine.commands`, as its inputs:
  forgetting a session, flushing the disk cache, stopping) and the requests whose clients
  cancelled since the last tick. It sends the tick to every rank, then applies it; the
  other ranks apply the same ticks in the same order, each command through the engine's
  own table (``Engine.apply``), and after each one step their decode batch exactly when
  rank 0 steps its own.
- A request's cancel flag is read only at ticks (latched): a cancel lands between two
  steps on every rank at once, never mid-prefill on one rank only.
- What follows from the ticks is computed, not sent: every rank renders the same prompt,
  samples the same token (the logits after the all-sum are the same bytes on every rank;
  sampling's random state is seeded alike at load), ends the reply at the same token.
- The cache: each rank's tree, pool and disk store hold its own heads (tensor parallel)
  or its own layers (pipeline: :mod:`core.distributed.shard`). Which prefix a
  request reuses must be the same length everywhere, though a rank's disk may have
  lost pages another still holds (damage, a full disk, another world size): before a
  request is prefilled the ranks agree on the shortest match among them
  (:class:`AgreedPrefixCache`, an ``all_min``), so a hit on rank 0 is a hit everywhere
  or a recompute everywhere, never a different answer. A pipeline's ranks hold different
  layers, so their caches could differ in kind (one rank's layers all paged, another's
  with recurrent state, which snapshots and so prefills in other chunks): the ranks
  compare theirs at load, and where they differ the prefix cache is off on every rank
  (every forward must run on every rank alike).

Every rank checks the others: when a request ends, each of the other ranks tells rank 0 a
digest of how it ended (the reply's text and tokens, or the error), and rank 0 compares it
with its own. Ranks out of step are a bug: the group stops rather than go on answering.

A fault (a rank gone, silent or failed, or out of step: :mod:`core.distributed.group`)
ends every open request at once with an error naming the host; the caller then stops the
process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import queue
import random
import threading

from core.distributed.group import FollowerChannel, LeaderChannel, Membership
from core.distributed.shard import PIPELINE, TENSOR, rank_cache_name, rank_fingerprint, shard_model
from core.distributed.wire import (
    command_from_dict,
    command_to_dict,
    request_from_dict,
    request_to_dict,
)
from core.engine.commands import WHEN_IDLE, LoadCommand
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.handle import RequestHandle, TokenizedRequest, tokenize
from core.engine.pacing import ChunkPacer
from core.engine.types import DoneEvent, ErrorEvent
from core.errors import ErrorKind, ModelLoadError, UserError

log = logging.getLogger(__name__)


class ShardHandle:
    """A request as every rank runs it: the request, a cancel flag latched at ticks, and
    (on rank 0) the client's handle its events go to. The engine side of a
    :class:`RequestHandle` (``emit``, ``finish``, ``tokenized``): an
    :class:`core.engine.handle.EngineHandle`, which the scheduler uses."""

    def __init__(self, rid: int, request, client: RequestHandle | None, on_end):
        self.rid = rid
        self.request = request
        self.client = client
        self._on_end = on_end
        self.latched = False
        self.outcome = "no end"  # a digest of how the request ended (compared across ranks)
        # see ShardedEngine.admit
        self.tokenized: TokenizedRequest | None = None
        self.prompt_s = 0.0

    @property
    def cancelled(self) -> bool:
        return self.latched

    def emit(self, event) -> None:
        if isinstance(event, DoneEvent):
            text = hashlib.sha256(event.text.encode()).hexdigest()[:16]
            self.outcome = (
                f"{event.stats.finish_reason} {event.stats.completion_tokens} tokens {text}"
            )
        elif isinstance(event, ErrorEvent):
            self.outcome = f"error {event.kind.value}"
        if self.client is not None:
            self.client.emit(event)

    def finish(self) -> None:
        if self.client is not None:
            self.client.finish()
        self._on_end(self)


class AgreedPrefixCache:
    """The prefix cache as the scheduler sees it on a rank of a group: ``match`` returns a
    prefix of the same length on every rank (the shortest any rank holds); the rest is the
    rank's own prefix cache."""

    def __init__(self, inner, mlx_group):
        self._inner = inner
        self._group = mlx_group

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _min(self, value: int) -> int:
        import mlx.core as mx

        from core.mlx_lm_compat import generation_stream

        # A decode step may still be running on the generation stream (launched ahead, as
        # mlx-lm does): its collectives and this one would share the group's connections in
        # an order that can differ between ranks (a pipeline's send/recv then read each
        # other's bytes), so it finishes first.
        mx.synchronize(generation_stream)
        return int(
            mx.distributed.all_min(
                mx.array([value], dtype=mx.int32), group=self._group, stream=mx.cpu
            ).item()
        )

    def match(self, prompt: list[int], namespace: str = "", session: str | None = None):
        prefix = self._inner.match(prompt, namespace, session)
        agreed = self._min(prefix.length)
        while True:
            # longer here: take the agreed part (a snapshot's end, if hybrid)
            if prefix.length != agreed:
                self._inner.release(prefix)
                prefix = self._inner.match(prompt[: agreed + 1], namespace)
            lowest = self._min(prefix.length)
            if lowest == agreed:  # every rank now holds exactly ``agreed``
                return prefix
            agreed = lowest


class GroupPacer(ChunkPacer):
    """Prefill chunks interleaved with decode, sized alike on every rank: a rank's measured
    rate is its own, so none is used (the smallest chunk while others decode)."""

    def observe(self, tokens: int, seconds: float) -> None:
        pass


class ShardedEngine(Engine):
    """:class:`Engine` on one rank of a group (see the module's docstring), through the
    engine's hooks: its own loop (:meth:`run`), loading its shard, installing it with what
    the ranks agree on, working a request's prompt out in step, waiting for the others
    before it parks. ``config``'s disk cache is the rank's own file in the data folder."""

    def __init__(
        self,
        data_root,
        member: Membership,
        mlx_group,
        channel,
        split: str = TENSOR,
        *,
        model_spec: str | None = "default",
        config: EngineConfig | None = None,
        on_load_progress=None,
    ):
        path = data_root / rank_cache_name(member.rank, member.world)
        super().__init__(
            data_root,
            model_spec,
            config=dataclasses.replace(config or EngineConfig(), kv_cache_path=path),
            on_load_progress=on_load_progress,
        )
        self.member = member
        # TENSOR or PIPELINE (decided before launch: core.distributed.shard.split_plan)
        self.split = split
        self.mlx_group = mlx_group
        self.channel: LeaderChannel | FollowerChannel = channel
        self._live: dict[int, ShardHandle] = {}  # engine thread: requests admitted, not finished
        self._clients: set[RequestHandle] = set()  # rank 0: client handles not yet finished
        self._clients_lock = threading.Lock()
        self._next_id = 0
        self.fault: str | None = None
        # rank 0: (rank, request id) -> digest, first told
        self._outcomes: dict[tuple[int, int], str] = {}
        self._outcomes_lock = threading.Lock()
        if isinstance(channel, LeaderChannel):
            channel.on_message = self._on_peer_message

    # ------------------------------------------------------------ client API (rank 0)
    def submit(self, request) -> RequestHandle:
        handle = RequestHandle(request)
        with self._clients_lock:
            fault = self.fault
            if fault is None:
                self._clients.add(handle)
        if fault is not None:
            handle.emit(ErrorEvent(fault, ErrorKind.MODEL_NOT_LOADED))
            handle.finish()
            return handle
        self._commands.put(handle)
        return handle

    def embed(self, request, timeout: float | None = 60.0):
        """Refused: a group runs only what every rank applies as a tick, and embeddings
        are not one (yet)."""
        raise UserError("embeddings are not served by a group of machines: serve them alone")

    def wait_stopped(self) -> None:
        """Block until the group stops (rank 0 said so) and this rank's cache is flushed."""
        self._stopped.wait()

    def fail_group(self, message: str) -> None:
        """The group broke (any thread): end every open request with ``message``; later
        requests get it at once."""
        with self._clients_lock:
            self.fault = message
            clients, self._clients = self._clients, set()
        for handle in clients:
            handle.emit(ErrorEvent(message, ErrorKind.MODEL_NOT_LOADED))
            handle.finish()

    # ------------------------------------------------------------ loading (every rank)
    def load_model(self, spec: str, weights_format: str):
        """Load this rank's shard; then every rank learns whether all ranks loaded, and
        sampling's random state is seeded alike everywhere."""
        import mlx.core as mx

        if self._info is not None:
            raise ModelLoadError(
                "a group serves the model it started with: restart the group to change it"
            )
        loaded = error = None
        try:
            loaded = super().load_model(
                spec,
                weights_format,
                shard=lambda model: shard_model(model, self.mlx_group, self.split),
                parts=self.member.world,
            )
        except Exception as exc:  # reported after the others learn of it
            error = exc
        ok = [0] * self.member.world
        ok[self.member.rank] = int(error is None)
        seed = random.getrandbits(30) if self.member.leader else 0
        status = mx.distributed.all_sum(
            mx.array(ok + [seed], dtype=mx.int32), group=self.mlx_group, stream=mx.cpu
        ).tolist()
        if error is not None:
            raise error
        failed = [self.member.name(r) for r in range(self.member.world) if not status[r]]
        if failed:
            raise ModelLoadError(f"{', '.join(failed)} could not load {spec} (its log says why)")
        mx.random.seed(status[-1])
        fingerprint = rank_fingerprint(
            loaded.info.fingerprint, self.member.rank, self.member.world, self.split
        )
        loaded.info = dataclasses.replace(loaded.info, fingerprint=fingerprint)
        return loaded

    def install(self, loaded, command) -> None:
        """As the engine does, with the pool as large as the smallest rank's (so the trees
        evict alike) and the agreed match."""
        import mlx.core as mx

        config = self.config  # a group loads once: what the ranks agree on is its config
        if self.split == PIPELINE and config.use_cache:
            config = dataclasses.replace(config, use_cache=self._same_cache_kind(loaded))
        if config.pool_tokens is None and config.pool_bytes is None and config.use_cache:
            config = dataclasses.replace(config, pool_tokens=self._agreed_pool_tokens(loaded))
        self.config = config
        super().install(loaded, command)
        self._scheduler.use_cache(AgreedPrefixCache(self._cache, self.mlx_group))
        # chunk sizes the same on every rank
        if self._scheduler.prefill.pacer is not None:
            self._scheduler.prefill.pacer = GroupPacer()
        # the ranks agree on each prompt's cached prefix one prompt at a time: no batched prefill
        self._scheduler.prefill.batch_prefill = False
        # draft lengths by acceptance alone: step times differ between ranks, so lengths
        # chosen by them would too, and the verifying forwards would not pair up
        self._scheduler.step_costs = None
        # all installed
        mx.eval(mx.distributed.all_sum(mx.array(1), group=self.mlx_group, stream=mx.cpu))

    def _same_cache_kind(self, loaded) -> bool:
        """Whether this pipeline's ranks cache alike (every rank's layers paged, or every
        rank's hybrid in the same way); if not, the prefix cache is off on every rank."""
        import mlx.core as mx

        from kvcache.layout import cache_layout

        try:
            layout = cache_layout(loaded.model)
            kind = 1 + int(layout.is_hybrid_swa) + 2 * int(layout.is_hybrid_ssm)
        except ValueError:
            kind = 0  # no paged cache for these layers
        kinds = [0] * self.member.world
        kinds[self.member.rank] = kind
        kinds = mx.distributed.all_sum(
            mx.array(kinds, dtype=mx.int32), group=self.mlx_group, stream=mx.cpu
        ).tolist()
        if len(set(kinds)) == 1 and kinds[0]:
            return True
        log.warning(
            "prefix cache off: the pipeline's ranks cache differently (kinds %s by rank)", kinds
        )
        return False

    def _agreed_pool_tokens(self, loaded) -> int | None:
        import mlx.core as mx

        from kvcache.builder import DEFAULT_PAGE_SIZE
        from kvcache.layout import cache_layout
        from kvcache.pool import pool_pages_for_budget

        page = self.config.page_size or DEFAULT_PAGE_SIZE
        try:
            pages = pool_pages_for_budget(
                cache_layout(loaded.model),
                page,
                weight_bytes=loaded.info.weight_bytes,
                fraction=0.25,
            )
        except ValueError:
            pages = -1  # no paged cache for this model: the builder says why
        lowest = int(
            mx.distributed.all_min(
                mx.array([pages], dtype=mx.int64), group=self.mlx_group, stream=mx.cpu
            ).item()
        )
        return lowest * page if lowest > 0 else None

    # ------------------------------------------------------------ the loop
    def run(self) -> None:
        first = self._commands.get()  # the model every rank loads at start
        if isinstance(first, LoadCommand):
            self.apply(first)
        else:
            self._ready.set()
        if self._info is None:
            self.channel.faults.closing = True  # the load failed: the caller ends the process
            self._park()
        try:
            if self.member.leader:
                self._lead()
            else:
                self._follow()
        except Exception as exc:  # a bug: the group cannot go on in step
            log.exception("the engine of %s failed", self.member.name(self.member.rank))
            if isinstance(self.channel, FollowerChannel):
                self.channel.report_fault(f"engine failed: {exc}")
            else:
                self.channel.faults.report(f"{self.member.name(0)} failed: engine failed: {exc}")

    def _lead(self) -> None:
        deferred: list = []
        while True:
            busy = self._scheduler is not None and self._scheduler.busy
            command = None
            if deferred and not busy:
                command = deferred.pop(0)
            else:
                try:
                    command = self._commands.get(block=not busy)
                except queue.Empty:
                    pass
            if isinstance(command, LoadCommand):
                command.error = (
                    "a group serves the model it started with: restart the group to change it"
                )
                command.done.set()
                command = None
            elif busy and isinstance(command, WHEN_IDLE):
                deferred.append(command)
                command = None
            if command is None and not busy:
                continue
            tick = {"op": "tick", "cancel": self._cancels(), "cmd": self._encode(command)}
            self.channel.broadcast(tick)
            self._apply_tick(tick, command)

    def _follow(self) -> None:
        while True:
            self._apply_tick(self.channel.receive(), None)

    def _cancels(self) -> list[int]:
        return [
            rid
            for rid, shard in self._live.items()
            if shard.client is not None and shard.client.cancelled and not shard.latched
        ]

    def _encode(self, command) -> dict | None:
        if command is None:
            return None
        if isinstance(command, RequestHandle):
            self._next_id += 1
            return {
                "op": "request",
                "id": self._next_id,
                "request": request_to_dict(command.request),
                "cancelled": command.cancelled,
            }
        return command_to_dict(command)

    def _apply_tick(self, tick: dict, local) -> None:
        """Apply one tick (``local``: rank 0's own command object, whose answers its client
        waits for); a stop never returns."""
        for rid in tick.get("cancel") or ():
            if rid in self._live:
                self._live[rid].latched = True
        cmd = tick.get("cmd")
        if cmd is not None and cmd["op"] == "request":
            shard = ShardHandle(
                cmd["id"],
                local.request if local is not None else request_from_dict(cmd["request"]),
                local,
                self._ended,
            )
            shard.latched = bool(cmd["cancelled"])
            self._live[shard.rid] = shard
            self.admit(shard)
        elif cmd is not None:
            self.apply(local if local is not None else command_from_dict(cmd))
        if self._scheduler is not None and self._scheduler.busy:
            self._step()

    def before_park(self) -> None:
        """Every rank has closed its cache before any parks: the others tell rank 0, which
        waits for them. From here on a peer leaving is the group stopping, not a fault (the
        channel's ``closing``: rank 0 may exit before another rank has)."""
        self.channel.faults.closing = True
        if isinstance(self.channel, FollowerChannel):
            self.channel.send({"op": "stopped"})
        else:
            self.channel.wait_stopped()

    def admit(self, handle) -> None:
        """As the engine does, with the prompt worked out here, in step on every rank (a
        prompt thread would hand it back at a different step on each): a group renders and
        tokenises on the engine thread."""
        if not handle.cancelled and handle.tokenized is None and self._prompts is not None:
            try:
                handle.tokenized = tokenize(handle.request, self._prompts)
            except UserError as exc:
                handle.emit(ErrorEvent(str(exc), exc.kind))
                handle.finish()
                self._count_served()
                return
        super().admit(handle)

    def _ended(self, shard: ShardHandle) -> None:
        self._live.pop(shard.rid, None)
        if isinstance(self.channel, FollowerChannel):
            self.channel.send({"op": "outcome", "id": shard.rid, "outcome": shard.outcome})
            return
        if shard.client is not None:
            with self._clients_lock:
                self._clients.discard(shard.client)
        for rank in range(1, self.member.world):
            self._compare(rank, shard.rid, shard.outcome)

    def _on_peer_message(self, rank: int, message: dict) -> None:
        if message.get("op") == "outcome":
            self._compare(rank, int(message["id"]), str(message["outcome"]))

    def _compare(self, rank: int, rid: int, outcome: str) -> None:
        """Rank 0's and ``rank``'s digests of request ``rid``, whichever comes second
        compared with the first (any thread)."""
        with self._outcomes_lock:
            other = self._outcomes.pop((rank, rid), None)
            if other is None:
                self._outcomes[(rank, rid)] = outcome
                return
        if other != outcome:
            self.channel.faults.report(
                f"{self.member.name(rank)} is out of step with rank 0 (request {rid} ended "
                f"{outcome!r} on one, {other!r} on the other)"
            )
