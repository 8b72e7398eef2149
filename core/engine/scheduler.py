"""Requests on the engine thread: prefill a chunk at a time, decode together in one batch.

A new request is rendered and checked, then waits its turn (``core.engine.turns``: by
priority, then round robin between clients, then arrival: the chat window's turns before
API requests, see ``core.engine.types.CHAT_PRIORITY``, and each chunk to the client served
least recently, so a long prompt half prefilled yields to another client's short one; a
client is its cache namespace less any salt, and may have at most ``max_waiting`` prompts
waiting). Its prefill is state the scheduler advances one chunk per step: each step first
gives every decoding request its next token, then feeds one chunk of the waiting prompt
whose turn it is, sized by ``core.engine.pacing`` so the decoding streams (or a prompt
that arrives meanwhile) wait at most about ``DECODE_WAIT_S`` for it. A prompt is matched
against the prefix cache (RAM, then disk) when its prefill starts, is cancellable between
chunks (a cancel keeps the chunks done in the cache), and snapshots hybrid state right
before its last prompt token; the first token is sampled from its prefill's logits. A
request that runs alone then decodes on its own cache objects the way
``mlx_lm.generate_step`` does (one sequence, the next step queued before the current token
is read), with nothing to merge, mask or extract. When a second request gets its first
token, the running one hands its cache over to the decode batch
(``core.engine.decode_batch``, over mlx-lm's ``GenerationBatch``), which takes per-request
prompt caches and decodes every running request in one forward pass per step; a request
joins it with its first token as its next input, so joining costs the others no forward
pass of its own. The batch shares its rows fairly between clients (it parks a row of a
client over its share for a client under it). When a request ends (EOS, stop string, max
tokens, cancel) it leaves with its cache, which goes into the radix tree and, for
sessions, to disk.

A request decoding alone speculates (``core.engine.speculation``): each step may feed a
draft of the next tokens (``core.engine.drafts``: from its own text, the radix tree or a
draft model) with its last token and take what the model agrees with. Rows of the batch
decode a token a step.

The scheduler is in parts: this module admits requests and steps the decoding ones;
``core.engine.prefill_steps`` runs the prefill and the first token, ``core.engine.replies``
takes each token and finishes a request, ``core.engine.running`` holds what is kept of each.
"""

from __future__ import annotations

import logging
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

from core.engine import generic_tools
from core.engine.constrain import Grammars
from core.engine.decode_batch import DecodeBatch
from core.engine.draft_length import StepCosts
from core.engine.drafts import Drafter, DraftModel
from core.engine.generation import StopText, sampling_tools, vocab_size
from core.engine.handle import EngineHandle, TokenizedRequest
from core.engine.pacing import IDLE_WAIT_S, ChunkPacer
from core.engine.prefill_steps import Prefiller
from core.engine.reasoning import ReasoningText, opens_thinking, thinking_markup
from core.engine.replies import Finisher
from core.engine.running import Active, PrefillJob, Solo, group_of, group_of_request
from core.engine.speculation import can_speculate, trim, verify
from core.engine.tools import ToolCallText
from core.engine.turns import DEFAULT_SHARING, PrefillSharing, PrefillTurns
from core.errors import ContextLengthError, UserError
from core.mlx_lm_compat import generation_stream
from kvcache.continuations import Continuations
from kvcache.tiered import TieredCache

MAX_BATCH = 16  # requests decoded together

log = logging.getLogger(__name__)


class Scheduler:
    """Admits requests and steps the shared decode batch of one loaded model. It holds two
    components: ``prefill`` (:class:`core.engine.prefill_steps.Prefiller`: the requests
    waiting for their prefill, whose turn, a chunk per step; it hands each back to
    :meth:`start_decoding` or :meth:`join_rows`) and ``replies``
    (:class:`core.engine.replies.Finisher`: each token taken, a request finished); the
    order between clients is :mod:`core.engine.turns`'."""

    def __init__(
        self,
        loaded,
        cache: TieredCache | None,
        on_finished=lambda: None,
        on_progress=lambda: None,
        pacer: ChunkPacer | None = None,
        interleave: bool = True,
        batch_prefill: bool = True,
        speculative: str = "ngram",
        draft_model=None,
        sharing: PrefillSharing = DEFAULT_SHARING,
    ):
        self.loaded = loaded
        # Speculative decoding for requests that do not say (core.engine.drafts): "off",
        # "ngram" (drafts from the request's text and the radix tree) or "draft" (from
        # ``draft_model``, an mlx-lm model of the same vocabulary)
        self.speculative = speculative
        self.draft_model = draft_model
        # seconds of a solo decode step by draft length, measured as they run: the drafts'
        # lengths weigh acceptance against them (core.engine.draft_length); None: lengths by
        # acceptance alone (a group's ranks, which must all decide alike: core.distributed)
        self.step_costs: StepCosts | None = StepCosts()
        self._plain_run, self._plain_at = 0, 0.0  # solo plain steps in a row, the last's start
        self.continuations = (
            Continuations(cache.ram.tree) if cache is not None and cache.enabled else None
        )
        self.cache = cache  # the KV cache's one door, both tiers (None: caching is off)
        # each token taken, the text sent, a request finished and committed to ``cache``
        self.replies = Finisher(set(loaded.tokenizer.eos_token_ids), cache, on_finished)
        self.prefill = Prefiller(
            loaded,
            cache,
            self.replies,
            self,
            # whose prompt takes the next chunk, and how many one client may queue
            turns=PrefillTurns(sharing.max_waiting, round_robin=sharing.round_robin),
            # sizes prefill chunks; None (interleave off): a prompt is prefilled whole in the
            # step that starts it, as before interleaving
            pacer=(
                (pacer or ChunkPacer(idle_budget_s=IDLE_WAIT_S if sharing.round_robin else None))
                if interleave
                else None
            ),
            # prompts that wait together prefilled in one padded forward
            # (core.engine.batch_prefill)
            batch_prefill=batch_prefill,
            on_progress=on_progress,
            on_finished=on_finished,
        )
        self.vocab = vocab_size(loaded.model, loaded.config)
        self.markup = generic_tools.markup_for(loaded.tokenizer)  # the template's, or generic
        self.thinking = thinking_markup(loaded.tokenizer)  # a reasoning model's markers, or None
        self.grammars = Grammars(loaded.tokenizer, self.vocab or len(loaded.tokenizer.get_vocab()))
        self.batch = DecodeBatch(loaded.model, MAX_BATCH)
        self.batched: dict[int, Active] = {}  # batch uid -> request
        self.solo: Solo | None = None

    def use_cache(self, cache) -> None:
        """Admit and finish requests through ``cache`` from now on (a group's agreed view of
        the tiered cache: core.distributed.engine)."""
        self.cache = self.replies.cache = self.prefill.cache = cache

    @property
    def waiting(self) -> list[PrefillJob]:
        """The requests admitted and not decoding yet (the prefill's)."""
        return self.prefill.waiting

    @property
    def active(self) -> list[Active]:
        """Every decoding request."""
        return list(self.batched.values()) + ([self.solo.state] if self.solo is not None else [])

    @property
    def running(self) -> int:
        """Requests admitted and not yet finished: decoding, prefilling or waiting to."""
        return len(self.batched) + (self.solo is not None) + len(self.waiting)

    @property
    def busy(self) -> bool:
        return bool(self.batched) or self.solo is not None or bool(self.waiting)

    # ------------------------------------------------------------------ step
    def step(self) -> None:
        """One decode step for every decoding request, then one chunk of prefill for the
        waiting request whose turn it is: a long prompt goes in between the others' tokens."""
        if self.solo is not None or self.batched:
            self._decode_step()
        if self.prefill.waiting:
            self._plain_run = 0  # a prefill chunk in between: not a plain step's time
            self.prefill.step()

    # ------------------------------------------------------------------ admit
    def admit(self, handle: EngineHandle) -> None:
        """Check ``handle``'s request, its prompt worked out (``handle.tokenized``, taken
        here), and queue it for prefill (:meth:`step` runs it, a chunk at a time). Raises
        UserError for a request that cannot run."""
        tokenized, handle.tokenized = handle.tokenized, None
        if tokenized is None or tokenized.request is not handle.request:
            raise ValueError("the scheduler admits a request whose prompt is worked out")
        request, loaded = handle.request, self.loaded
        client = group_of_request(request)
        self.prefill.check_room(client)  # its queue is full: refused at once
        started = time.perf_counter() - handle.prompt_s  # rendered and tokenised on a prompt thread
        # schemas checked on the prompt thread (engine.py)
        prompt = list(tokenized.tokens)
        context = loaded.info.context_length
        if self.vocab is not None and not 0 <= min(prompt) <= max(prompt) < self.vocab:
            bad = next(t for t in prompt if not 0 <= t < self.vocab)
            raise UserError(
                f"token id {bad} is not in {loaded.info.name}'s vocabulary "
                f"(ids 0 to {self.vocab - 1})"
            )
        if len(prompt) >= context:
            raise ContextLengthError(
                f"the prompt is {len(prompt)} tokens but {loaded.info.name} has a context of "
                f"{context}"
            )
        if request.speculative == "draft" and self.draft_model is None:
            raise UserError(
                "speculative decoding with a draft model: this server has none "
                "(radixchat serve --draft-model MODEL)"
            )
        params = request.sampling
        grammar = generic_tools.grammar_for(request, self.markup)  # before prefill: fails at once
        sampler, processors = sampling_tools(params, self.vocab)
        if grammar is not None:
            grammar = self.grammars.processor(grammar, len(prompt))
            processors = [*processors, grammar]
        calls_on = request.tools and request.tool_choice != "none"
        state = Active(
            handle=handle,
            prompt=prompt,
            started=started,
            max_tokens=min(params.max_tokens, context - len(prompt)),
            stop_text=StopText(params.stop),
            detok=loaded.tokenizer.detokenizer,
            tool_text=ToolCallText(self.markup, request.tools) if calls_on else None,
            grammar=grammar,
            reasoning=self._reasoning(tokenized, prompt, grammar),
        )
        self.prefill.queue(state, sampler, processors, client, request.priority)

    def _reasoning(
        self, tokenized: TokenizedRequest, prompt: list[int], grammar
    ) -> ReasoningText | None:
        """The thinking splitter of a chat reply from a reasoning model (None for a text
        completion). A reply held to a grammar starts as the answer, whatever its prompt
        opened: the grammar's output is the answer."""
        if self.thinking is None or not tokenized.templated:
            return None
        inside = grammar is None and opens_thinking(self.thinking, prompt)
        return ReasoningText(self.thinking, inside)

    # ------------------------------------------------------------------ from the prefill
    @property
    def decoding(self) -> bool:
        """Whether any request decodes now (alone or in the batch)."""
        return self.solo is not None or bool(self.batched)

    def decoding_rows(self, client: str) -> int:
        """How many of ``client``'s requests decode now."""
        alone = self.solo is not None and group_of(self.solo.state) == client
        return self.batch.rows_of(client) + alone

    def start_decoding(self, job: PrefillJob, caches: list, first: int) -> None:
        """``job``'s prompt is in and ``first`` taken: it decodes alone when nothing else
        does, else in the batch (a request decoding alone joins it first)."""
        if not self.decoding:
            self._go_solo(job, caches, first)
            return
        if self.solo is not None:
            self._hand_over()
        state = job.state
        self._insert(state, first, caches, list(state.prompt), job.sampler, job.processors)

    def join_rows(self, joining: list[tuple[int, PrefillJob, int]], rows) -> None:
        """A batched prefill's requests that go on, as (row, job, first token): they join
        the decode batch together, their merged caches as they are (or, alone, decode solo)."""
        try:
            if len(joining) == 1 and not self.decoding:
                row, job, first = joining[0]
                self._go_solo(job, rows.caches(row), first)
                return
            if self.solo is not None:
                self._hand_over()
            rows.keep([row for row, _, _ in joining])
            uids = self.batch.join_rows(
                [first for _, _, first in joining],
                rows.batch.prompt_cache,
                rows.batch.tokens,
                [job.sampler for _, job, _ in joining],
                [job.processors for _, job, _ in joining],
                [job.state.max_tokens - len(job.state.generated) for _, job, _ in joining],
                [group_of(job.state) for _, job, _ in joining],
            )
        except Exception as exc:
            log.exception("starting a batched prefill's requests failed")
            for _, job, _ in joining:
                self.replies.fail(job.state, f"internal error: {exc}")
            return
        for uid, (_, job, _) in zip(uids, joining):
            self.batched[uid] = job.state

    def _go_solo(self, job: PrefillJob, caches: list, first: int) -> None:
        """Nothing else decodes: ``job`` decodes alone, ``first`` its next input."""
        prompt = job.state.prompt
        solo = Solo(
            job.state,
            caches,
            job.sampler,
            job.processors,
            list(prompt) + [first],
            None,
            mx.array(prompt) if job.processors else None,
        )
        solo.pending = self._solo_forward(solo, mx.array([first]))
        solo.drafter = self._drafter(job.state, caches)
        self.solo = solo

    def _drafter(self, state: Active, caches: list) -> Drafter | None:
        """The drafts of a request decoding alone, or None where speculation is off for it:
        asked off, constrained by a grammar (its state advances a token at a time), or on
        caches that cannot give tokens back (a hybrid model's: core.engine.speculation)."""
        request = state.handle.request
        mode = request.speculative or self.speculative
        if mode == "off" or state.grammar is not None or not can_speculate(caches):
            return None
        text = [*state.prompt, *state.generated]
        if mode == "draft" and self.draft_model is not None:
            return Drafter(
                text, model=DraftModel(self.draft_model, self._draft_caches), costs=self.step_costs
            )
        tree = None
        if self.continuations is not None and request.use_cache:
            namespace, follow = request.cache_namespace, self.continuations.follow
            tree = lambda context, limit: follow(context, limit, namespace)  # noqa: E731
        return Drafter(text, tree=tree, costs=self.step_costs)

    def _draft_caches(self) -> list:
        return make_prompt_cache(self.draft_model)

    def _insert(self, state: Active, last: int, caches, cache_tokens, sampler, processors) -> None:
        """Join the batch: ``last`` (taken, not yet in ``caches``) is fed at its next step."""
        uid = self.batch.join(
            last,
            caches,
            cache_tokens,
            sampler,
            processors,
            state.max_tokens - len(state.generated),
            group_of(state),
        )
        self.batched[uid] = state

    # ------------------------------------------------------------------ solo decode
    def _solo_forward(self, solo: Solo, y: mx.array) -> mx.array:
        """Feed token ``y`` (shape ``(1,)``) into the solo caches; queue sampling the next."""
        with mx.stream(generation_stream):
            logits = self.loaded.model(y[None], cache=solo.caches)[:, -1, :]
            if solo.processors:
                solo.context = mx.concatenate([solo.context, y])
                for processor in solo.processors:
                    logits = processor(solo.context, logits)
            # as the decode batch's _Batch
            if solo.sampler is greedy_sampler and not solo.processors:
                sampled = mx.argmax(logits, axis=-1)
            else:
                sampled = solo.sampler(logits - mx.logsumexp(logits, keepdims=True))
        mx.async_eval(sampled)
        return sampled

    def _solo_step(self) -> None:
        solo = self.solo
        state = solo.state
        if state.handle.cancelled:
            self.solo = None
            self.replies.finish_safely(state, "cancelled", solo.caches, solo.cache_tokens)
            return
        current = solo.pending
        # Queue the step after this one before waiting for this token (as generate_step
        # does), unless this token is the last one max_tokens allows.
        feed = len(state.generated) + 1 < state.max_tokens
        if feed:
            solo.pending = self._solo_forward(solo, current)
        token = current.item()
        if feed:
            solo.cache_tokens.append(token)
        finish = self.replies.take(state, token)
        if finish is None and not feed:
            finish = "length"
        if finish is not None:
            self.solo = None
            self.replies.finish_safely(state, finish, solo.caches, solo.cache_tokens)

    def _speculative_step(self) -> None:
        """Take the pending token, then feed it with a draft of what follows in one forward
        (``core.engine.speculation``): the accepted draft tokens are taken at once, the
        model's own next token is the new pending one. Without a draft, a plain step."""
        solo = self.solo
        state = solo.state
        last = solo.pending.item()
        started = time.perf_counter()
        finish = self.replies.take(state, last)
        _catch_up(solo.drafter, state)
        draft = (
            solo.drafter.propose(state.max_tokens - len(state.generated) - 1)
            if finish is None
            else []
        )
        if finish is None and not draft:
            solo.pending = self._solo_forward(solo, mx.array([last]))
            solo.cache_tokens.append(last)
            return
        if finish is not None:
            self.solo = None
            self.replies.finish_safely(state, finish, solo.caches, solo.cache_tokens)
            return
        verdict = verify(
            self.loaded.model,
            solo.caches,
            last,
            draft,
            solo.sampler,
            solo.processors,
            solo.context,
        )
        accepted = verdict.accepted
        solo.drafter.observe(len(draft), len(accepted))
        # the step's time: its draft found (or drafted) and verified
        if self.step_costs is not None:
            self.step_costs.record(len(draft), time.perf_counter() - started)
        state.drafted += len(draft)
        state.accepted += len(accepted)
        solo.cache_tokens.extend([last, *accepted])
        if solo.context is not None:
            solo.context = mx.concatenate([solo.context, mx.array([last, *accepted])])
        for i, token in enumerate(accepted):
            finish = self.replies.take(state, token)
            if finish is not None:  # the caches keep what the reply has, no more
                unused = len(accepted) - 1 - i
                trim(solo.caches, unused)
                del solo.cache_tokens[len(solo.cache_tokens) - unused :]
                self.solo = None
                self.replies.finish_safely(state, finish, solo.caches, solo.cache_tokens)
                return
        solo.pending = mx.array([verdict.next_token])

    def _time_plain_step(self) -> None:
        """Record a plain solo step's time: from one step's start to the next's, from the
        second step of a run on (the first after a draft or a prefill waited for no queued
        forward of its own)."""
        now = time.perf_counter()
        if self._plain_run >= 2 and self.step_costs is not None:
            self.step_costs.record(0, now - self._plain_at)
        self._plain_run += 1
        self._plain_at = now

    def _hand_over(self) -> None:
        """A second request is coming: the solo request joins the batch. If that fails
        (out of memory...), the solo request ends with an error rather than vanishing."""
        solo, self.solo = self.solo, None
        state = solo.state
        try:
            token = solo.pending.item()  # its pending token is taken now, then fed by the batch
            finish = self.replies.take(state, token)
            if finish is None and len(state.generated) >= state.max_tokens:
                finish = "length"
            if finish is not None or state.handle.cancelled:
                self.replies.finish_safely(
                    state, finish or "cancelled", solo.caches, solo.cache_tokens
                )
                return
            self._insert(
                state, token, solo.caches, solo.cache_tokens, solo.sampler, solo.processors
            )
        except Exception as exc:
            log.exception("moving a request into the decode batch failed")
            self.replies.fail(state, f"internal error: {exc}")

    # ------------------------------------------------------------------ decode
    def _decode_step(self) -> None:
        """One decode step for every running request."""
        if self.solo is not None:
            drafter = self.solo.drafter
            if drafter is not None and not self.solo.state.handle.cancelled:
                _catch_up(drafter, self.solo.state)
                if drafter.worth_a_look():
                    self._plain_run = 0
                    self._speculative_step()
                    return
            self._time_plain_step()
            self._solo_step()
            return
        self._plain_run = 0
        for uid, state in list(self.batched.items()):
            if state.handle.cancelled:
                caches, tokens = self.batch.remove(uid)
                del self.batched[uid]
                self.replies.finish_safely(state, "cancelled", caches, tokens)
        if not self.batched:
            return
        ending = []
        for generated in self.batch.step():
            state = self.batched.get(generated.uid)
            if state is None:
                continue
            finish = self.replies.take(state, generated.token)
            if finish is not None or generated.finished:
                ending.append((generated, state, finish))
        # every row's token is out before the rows that end store their caches (which takes
        # a while: docs/benchmarks.md): the last rows' last tokens do not wait for them
        for generated, state, finish in ending:
            if generated.finished:  # the batch let it go, with its cache
                caches, tokens = generated.caches, generated.cache_tokens
            else:
                caches, tokens = self.batch.remove(generated.uid)
            del self.batched[generated.uid]
            self.replies.finish_safely(state, finish or "length", caches, tokens)

    def fail_all(self, message: str) -> None:
        """A bug in a step: end every running request with an error, start a new batch."""
        for state in self.active:
            self.replies.fail(state, message)
        self.batched.clear()
        self.solo = None
        self.batch.close()
        self.batch = DecodeBatch(self.loaded.model, MAX_BATCH)


def _catch_up(drafter: Drafter, state: Active) -> None:
    """Tell ``drafter`` the tokens ``state`` took since it last heard."""
    drafter.extend(state.generated[len(drafter.tokens) - len(state.prompt) :])
