"""What the scheduler keeps of each request on the engine thread: a request decoding
(:class:`Active`), the one decoding alone (:class:`Solo`), one waiting for or part-way
through its prefill (:class:`PrefillJob`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx
from mlx_lm.tokenizer_utils import StreamingDetokenizer

from core.engine.drafts import Drafter
from core.engine.generation import ChunkedPrefill, StopText
from core.engine.namespaces import owner as namespace_owner
from core.engine.reasoning import ReasoningText
from core.engine.tools import ToolCallText
from core.engine.turns import Turn

if TYPE_CHECKING:  # annotations only
    from core.engine.constrain import GrammarProcessor
    from core.engine.handle import EngineHandle
    from kvcache.tiered import Prefix


@dataclass(kw_only=True)
class Active:
    """One running request (engine thread only), made by keyword."""

    handle: EngineHandle
    prompt: list[int]
    started: float  # perf_counter at arrival (its prompt's rendering counted in)
    max_tokens: int
    stop_text: StopText
    detok: StreamingDetokenizer  # the tokenizer's, fresh for this reply
    prefix: Prefix | None = None  # matched in the cache once its prefill starts
    cached: int = 0  # prompt tokens the RAM cache gave
    restored: int = 0  # of them, restored from disk
    tool_text: ToolCallText | None = None  # takes tool-call markup out of the text
    grammar: GrammarProcessor | None = None  # if constrained
    reasoning: ReasoningText | None = None  # a reasoning model's thinking out of the text
    first_token_at: float | None = None
    generated: list[int] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)
    thought: list[str] = field(default_factory=list)  # the thinking sent, piece by piece
    snapshots: list = field(default_factory=list)
    drafted: int = 0  # draft tokens proposed (speculative decoding)
    accepted: int = 0  # of them, accepted


@dataclass
class Solo:
    """The one request decoding outside the batch, as ``mlx_lm.generate_step`` would."""

    state: Active
    caches: list
    sampler: object
    processors: list
    cache_tokens: list[int]  # what ``caches`` hold
    pending: mx.array  # the next token: sampled, maybe still being computed, not yet taken
    context: mx.array | None  # prompt + generated, for logits processors
    drafter: Drafter | None = None  # speculative decoding's drafts (None: off for it)


@dataclass
class PrefillJob:
    """A request admitted but not yet decoding: waiting for its turn, or prefilling a chunk
    per scheduler step (engine thread only)."""

    state: Active
    sampler: object
    processors: list
    turn: Turn  # its client, priority and arrival (core.engine.turns)
    run: ChunkedPrefill | None = None  # once started
    caches: list | None = None
    compute_s: float = 0.0  # time spent in its chunks (not in others' decode steps between them)
    flush: bool = False  # restored from disk: flush the pool writes once it has its first token


def group_of(state: Active) -> str:
    """The client a request is from, for its fair share: its cache namespace less any salt."""
    return group_of_request(state.handle.request)


def group_of_request(request) -> str:
    """The client of ``request`` (a ``GenerationRequest``), as :func:`group_of`."""
    return namespace_owner(request.cache_namespace)
