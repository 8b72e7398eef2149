"""The decode batch: every running request's next token in one forward pass.

The batch is mlx-lm's ``GenerationBatch`` (the core of its ``BatchGenerator``): per-request
KV caches merged into batch caches, one forward per step, per-request samplers and logits
processors, a finished request leaving with its cache. What this module changes is how a
request joins. ``BatchGenerator`` takes a request as a prompt: it prefills it, and the
joining rows then take a forward pass of their own (``GenerationBatch.__init__`` steps
them) before they extend the running batch, so every join holds the running requests back
for one forward. The scheduler has already prefilled the request and sampled its first
token, so here a request joins with that token as its next input, and its first forward is
the running batch's next step. Profiled on the default model (8 streaming clients arriving
together), 7 of 45 decode forwards were such joins.

A joining row reports the token it joined with at the next step, like every row reports
the token it was fed; the caller has taken that token already, so the report is skipped
(and counted in the row's ``max_tokens``).

Rows are shared fairly between groups (the scheduler's group is the client: an API key,
the app's own chats). A row that cannot join a full batch waits; the waiting row whose
group has the fewest running rows goes in first (round robin between groups, arrival
order within one). And while a group runs fewer rows than its share (``max_rows`` over
the groups with rows, running or waiting) and has one waiting, the group furthest over
its share is *parked* a row: the row leaves the batch with its caches and its next
token, already sampled, and waits like a joining row; back in, it reports that token and
goes on as if never out (the same greedy reply). So 16 streams of one client cannot hold
another client's request out of the batch: it is in at the next step.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.sample_utils import greedy_sampler

from core.engine.cpu_speedups import shared_positions
from core.engine.quantized_batch import merge_rows
from core.mlx_lm_compat import (
    GreedyBatch,
    JoiningRows,
    generation_stream,
    maybe_set_recommended_wired_limit,
    row_to_park,
)

CLEAR_CACHE_EVERY = 512  # steps, as BatchGenerator does: MLX's buffer cache is given back


@dataclass(frozen=True)
class Generated:
    """One row's token from a step; a finished row comes with its caches and their tokens."""

    uid: int
    token: int
    finished: bool  # the row reached its max_tokens and left the batch
    caches: list | None = None
    cache_tokens: list[int] | None = None


class _Batch(GreedyBatch):
    """The running rows (mlx-lm's ``GenerationBatch`` with the greedy shortcut of
    ``GreedyBatch``), every layer's rotary table shared in a step where it can be."""

    def forward_context(self):
        """Every layer's cache at the same positions (full attention): one rotary table
        serves them all for this step (``core.engine.cpu_speedups``)."""
        if self.prompt_cache and all(type(c) is BatchKVCache for c in self.prompt_cache):
            return shared_positions(self.model, self.prompt_cache[0].offset)
        return super().forward_context()


class DecodeBatch:
    """The running requests' batch (engine thread only): at most ``max_rows`` decode
    together; a request joining a full batch waits (its caches kept) until a row leaves."""

    def __init__(self, model, max_rows: int):
        self.model = model
        self.max_rows = max_rows
        self._placeholder = mx.zeros((1,))
        self._batch = _Batch.empty(model, greedy_sampler)
        self._batch.placeholder = self._placeholder
        self._waiting: list[JoiningRows] = []
        self._skip: set[int] = set()  # rows whose next report is the token they joined with
        self._groups: dict[int, str] = {}  # uid -> its group (whose fair share it counts in)
        self.parked = 0  # rows parked so far (to let another group's row in)
        self._next_uid = 0
        self._steps = 0
        self._old_wired_limit = maybe_set_recommended_wired_limit()  # Metal: as BatchGenerator does

    def __len__(self) -> int:
        return len(self._batch) + sum(len(rows) for rows in self._waiting)

    def join(
        self,
        token: int,
        caches: list,
        cache_tokens: list[int],
        sampler,
        processors,
        max_tokens: int,
        group: str = "",
    ) -> int:
        """Add a request whose ``caches`` hold ``cache_tokens`` and whose next input is
        ``token`` (already taken by the caller, not yet in the caches), for at most
        ``max_tokens`` more tokens, in ``group`` (its fair share's). Returns its uid."""
        with mx.stream(generation_stream):
            merged = [merge_rows([layer]) for layer in caches]
        return self.join_rows(
            [token], merged, [cache_tokens], [sampler], [processors], [max_tokens], [group]
        )[0]

    def join_rows(
        self,
        tokens: list[int],
        merged: list,
        cache_tokens: list[list[int]],
        samplers: list,
        processors: list,
        max_tokens: list[int],
        groups: list[str] | None = None,
    ) -> list[int]:
        """Add requests together whose caches are already merged, a batch cache per layer
        with a row each (a batched prefill's, ``core.engine.batch_prefill``): as
        :meth:`join`, one value per row. Returns their uids."""
        if min(max_tokens) < 1:
            raise ValueError("a request joins the batch for at least one more token")
        uids = list(range(self._next_uid, self._next_uid + len(tokens)))
        self._groups.update(zip(uids, groups or [""] * len(uids)))
        with mx.stream(generation_stream):
            if len(uids) > 1 and (self._waiting or len(self._batch) + len(uids) > self.max_rows):
                # not all of them fit now: they wait a row each, as joins one by one do
                for i, uid in enumerate(uids):
                    one = [merge_rows([layer.extract(i)]) for layer in merged]
                    self._waiting.append(
                        self._rows(
                            [uid],
                            tokens[i : i + 1],
                            one,
                            cache_tokens[i : i + 1],
                            samplers[i : i + 1],
                            processors[i : i + 1],
                            max_tokens[i : i + 1],
                        )
                    )
            else:
                self._waiting.append(
                    self._rows(uids, tokens, merged, cache_tokens, samplers, processors, max_tokens)
                )
        self._next_uid += len(uids)
        self._skip.update(uids)
        self._admit_waiting()
        return uids

    def _rows(
        self, uids, tokens, merged, cache_tokens, samplers, processors, max_tokens
    ) -> JoiningRows:
        # one more token each: the report of the token a row joined with is skipped
        return JoiningRows(
            self.model,
            uids,
            tokens,
            merged,
            cache_tokens,
            samplers,
            processors,
            [n + 1 for n in max_tokens],
            self._placeholder,
        )

    def _admit_waiting(self) -> None:
        """Fill free rows, each with the waiting row whose group runs the fewest (the
        earliest of those): round robin between groups, arrival order within one."""
        while self._waiting and len(self._batch) < self.max_rows:
            running = self._running_by_group()
            rows = min(self._waiting, key=lambda r: running.get(self._groups.get(r.uids[0], ""), 0))
            self._waiting.remove(rows)
            with mx.stream(generation_stream):
                self._batch.extend(rows)

    def _running_by_group(self) -> dict[str, int]:
        running: dict[str, int] = {}
        for uid in self._batch.uids:
            group = self._groups.get(uid, "")
            running[group] = running.get(group, 0) + 1
        return running

    def rows_of(self, group: str) -> int:
        """Rows of ``group`` in the batch: running or waiting for a row."""
        return sum(1 for uid in self._groups if self._groups[uid] == group)

    def _share_fairly(self) -> None:
        """Park rows of the group furthest over its share while a group under its share has a
        row waiting and no row is free; then let the waiting rows in."""
        while self._waiting and len(self._batch) >= self.max_rows:
            running = self._running_by_group()
            groups = set(running) | {self._groups.get(r.uids[0], "") for r in self._waiting}
            share = max(1, self.max_rows // len(groups))
            if not any(
                running.get(self._groups.get(r.uids[0], ""), 0) < share for r in self._waiting
            ):
                return
            over = max(running, key=running.get)
            if running[over] <= share:
                return
            newest = max(
                i for i, uid in enumerate(self._batch.uids) if self._groups.get(uid, "") == over
            )
            self._park(newest)
        self._admit_waiting()

    def _park(self, index: int) -> None:
        """Row ``index`` leaves the batch with its caches and its next token (sampled, not yet
        reported) and waits for a row; back in, it reports that token first."""
        batch = self._batch
        uid = batch.uids[index]
        with mx.stream(generation_stream):
            caches = batch.extract_cache(index)
            merged = [merge_rows([layer]) for layer in caches]
            token, left = row_to_park(batch, index)
            rows = JoiningRows(
                self.model,
                [uid],
                [token],
                merged,
                [list(batch.tokens[index])],
                [batch.samplers[index]],
                [list(batch.logits_processors[index] or [])],
                [left],
                self._placeholder,
            )
            batch.filter([i for i in range(len(batch)) if i != index])
        self._waiting.append(rows)
        self.parked += 1

    def step(self) -> list[Generated]:
        """One forward for every row; the token each row was fed (its newest), rows that
        reached their ``max_tokens`` leaving with their caches."""
        self._share_fairly()
        if not len(self._batch):
            return []
        with mx.stream(generation_stream):
            responses = self._batch.next()
        self._admit_waiting()  # into the rows that left
        self._steps += 1
        if self._steps % CLEAR_CACHE_EVERY == 0:
            mx.clear_cache()
        out = []
        for response in responses:
            if response.uid in self._skip:  # never its last report: it joined for 2 or more
                self._skip.discard(response.uid)
                continue
            if response.finish_reason is not None:
                self._groups.pop(response.uid, None)
            out.append(
                Generated(
                    response.uid,
                    response.token,
                    response.finish_reason is not None,
                    response.prompt_cache,
                    response.all_tokens,
                )
            )
        return out

    def remove(self, uid: int) -> tuple[list, list[int]]:
        """Take a row out of the batch (cancelled, or done on the caller's terms): its
        caches and the tokens they hold."""
        self._skip.discard(uid)
        self._groups.pop(uid, None)
        for rows in self._waiting:
            if rows.uids == [uid]:
                self._waiting.remove(rows)
                return rows.extract_cache(0), rows.tokens[0]
        index = self._batch.uids.index(uid)
        with mx.stream(generation_stream):
            caches = self._batch.extract_cache(index)
            tokens = self._batch.tokens[index]
            self._batch.filter([i for i in range(len(self._batch)) if i != index])
        self._admit_waiting()
        return caches, tokens

    def close(self) -> None:
        if self._old_wired_limit is not None:
            mx.synchronize(generation_stream)
            mx.set_wired_limit(self._old_wired_limit)
            self._old_wired_limit = None

    def __del__(self):
        self.close()
