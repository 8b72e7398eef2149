"""Plain values that cross threads between the engine and its clients.

Nothing here imports mlx: the GUI, the HTTP server and the CLI build requests and
read events with these types only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import ErrorKind
from core.limits import SPECULATIVE_MODES


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` is greedy."""

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool the model made: ``arguments`` is JSON text (as OpenAI sends it)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """One message of a chat. An assistant message may carry the ``tool_calls`` it made and
    the ``reasoning`` (a reasoning model's thinking) that came before its content; a
    ``"tool"`` message carries one call's result, naming the call (``tool_call_id``)."""

    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None  # the tool's name, on a "tool" message
    reasoning: str = ""  # an assistant message's thinking (templates that keep it render it)


TOOL_CHOICES = ("auto", "none", "required", "function")


@dataclass(frozen=True)
class Speculation:
    """The engine's speculative decoding (``--speculative``, ``--draft-model``): ``mode`` for
    requests that do not choose, ``draft_model`` a model spec (the ``draft`` mode's)."""

    mode: str = "ngram"
    draft_model: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in SPECULATIVE_MODES:
            raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}")
        if self.mode == "draft" and self.draft_model is None:
            raise ValueError("speculative decoding with a draft model needs --draft-model")


# Which waiting request is prefilled first: the lowest ``priority``, then the earliest
# (vLLM's convention). API requests take 0 or more (0 by default); the chat window's turns
# (and ``radixchat chat``'s) take CHAT_PRIORITY, since a person is watching them.
CHAT_PRIORITY = -1


@dataclass(frozen=True)
class GenerationRequest:
    """One request: chat messages (rendered with the model's chat template) or raw text
    or token ids. ``session`` names the chat whose cache this request extends;
    ``cache_namespace`` says whose cached prefixes it may use (and where its own go):
    only those of requests in the same namespace (see :mod:`core.engine.namespaces`)."""

    messages: tuple[ChatMessage, ...] = ()
    prompt_text: str | None = None
    prompt_tokens: tuple[int, ...] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    session: str | None = None
    use_cache: bool = True
    cache_namespace: str = ""  # core.engine.namespaces: APP, API, for_key(...), with_salt(...)
    # Tools the model may call, OpenAI style ({"type": "function", "function": {"name",
    # "description", "parameters"}}), handed to the chat template. Plain dicts, never
    # changed once submitted.
    tools: tuple[dict, ...] = ()
    # "auto": the model chooses; "none": no tools (the template does not see them);
    # "required": some tool must be called; "function": ``tool_name`` must be called.
    # "required" and "function" constrain decoding to a valid call.
    tool_choice: str = "auto"
    tool_name: str | None = None
    # Structured output: the reply is JSON valid against this schema (constrained decoding).
    json_schema: dict | None = None
    # Admission order among waiting requests: lower goes first (see CHAT_PRIORITY).
    priority: int = 0
    # Speculative decoding for this request: "off", "ngram" or "draft" (core.engine.drafts);
    # None: the engine's setting.
    speculative: str | None = None
    # Extra variables for the chat template ({"enable_thinking": False}, {"reasoning_effort":
    # "low"}): the API's chat_template_kwargs, Anthropic's thinking, Responses' reasoning.
    # A plain dict of JSON values, never changed once submitted.
    template_kwargs: dict = field(default_factory=dict)
    # Token ids that come before the prompt (Ollama's ``context``: an earlier prompt and its
    # reply, sent back); the rendered messages or text follow them.
    context_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.tool_choice not in TOOL_CHOICES:
            raise ValueError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}")
        if self.speculative not in (None, *SPECULATIVE_MODES):
            raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}")
        if (self.tool_choice == "function") != (self.tool_name is not None):
            raise ValueError('tool_name goes with tool_choice="function", and only with it')


@dataclass(frozen=True)
class RequestStats:
    """What one request cost. Drives the cache panel, the API's usage and the benchmarks."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # served from the RAM cache
    restored_tokens: int = 0  # restored from the disk cache
    computed_tokens: int = 0  # prefilled by the model
    completion_tokens: int = 0
    ttft_s: float = 0.0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    total_s: float = 0.0
    constraint_cpu_s: float = 0.0  # CPU time spent enforcing a grammar (constrained decoding)
    finish_reason: str = "stop"  # "stop" | "length" | "cancelled" | "tool_calls"
    stop_sequence: str | None = None  # the stop string that ended the reply (finish_reason "stop")
    # the cache namespace that served the hit: a short label (namespaces.label)
    cache_namespace: str = ""
    # speculative decoding: draft tokens proposed, and of them accepted (each decode step
    # writes its accepted draft tokens and one of the model's own)
    draft_tokens: int = 0
    accepted_tokens: int = 0
    # of the completion tokens, those a reasoning model spent thinking (its markers included)
    reasoning_tokens: int = 0

    @property
    def tokens_per_step(self) -> float:
        """Reply tokens per decode forward (1.0 without speculation)."""
        steps = self.completion_tokens - self.accepted_tokens
        return self.completion_tokens / steps if steps > 0 else 1.0


@dataclass(frozen=True)
class TokenEvent:
    text: str
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ReasoningEvent:
    """A piece of a reasoning model's thinking (``<think>`` ... ``</think>``): never in a
    TokenEvent; front ends that show no thinking skip it."""

    text: str
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ProgressEvent:
    """Prefill progress: ``done`` of ``total`` prompt tokens computed."""

    done: int
    total: int


@dataclass(frozen=True)
class ToolCallEvent:
    """The model finished writing one tool call (its markup is never in a TokenEvent)."""

    call: ToolCall


@dataclass(frozen=True)
class DoneEvent:
    """The end of a reply: its ``text`` (the answer, without the thinking), its ``stats``,
    the ``tool_calls`` it made and its ``reasoning`` (the thinking, "" for none).
    ``prompt_tokens`` and ``reply_tokens``: the token ids of its prompt (as the model read
    it) and of its reply (as generated: a stop string's, the thinking's and tool-call
    markup's included), for a client that sends them back (Ollama's ``context``)."""

    text: str
    stats: RequestStats
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""
    prompt_tokens: tuple[int, ...] = ()
    reply_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class ErrorEvent:
    """A request ended in failure: ``kind`` says what failed, ``message`` (one line) says it
    in words. Front ends map the kind, never the words."""

    message: str  # one line
    kind: ErrorKind = ErrorKind.BAD_REQUEST

    @property
    def user_error(self) -> bool:
        """True for what the user can act on; False for a bug (logged with its traceback)."""
        return self.kind is not ErrorKind.INTERNAL


Event = TokenEvent | ReasoningEvent | ProgressEvent | ToolCallEvent | DoneEvent | ErrorEvent


@dataclass(frozen=True)
class EmbeddingRequest:
    """Inputs to embed with the loaded model, one unit-length vector each
    (:meth:`core.engine.engine.Engine.embed`; how: :mod:`core.engine.embedding`).

    ``inputs``: texts (tokenised as the model's tokenizer does, its special tokens added)
    or token ids. ``dimensions``: keep the first so many components of each vector and
    normalise again (None: all of them). ``truncate``: an input longer than the model's
    context is cut to fit (Ollama's ``truncate``) instead of refused. ``cache_namespace``
    and ``use_cache`` as a :class:`GenerationRequest`'s: a model pooled by its last token
    reuses the cached prefixes of its namespace (the others cannot: see the module)."""

    inputs: tuple[str | tuple[int, ...], ...]
    dimensions: int | None = None
    truncate: bool = False
    cache_namespace: str = ""
    use_cache: bool = True

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ValueError("nothing to embed: no inputs")
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError("dimensions must be at least 1")


@dataclass(frozen=True)
class EmbeddingResult:
    """The vectors of an :class:`EmbeddingRequest`, in the order of its inputs: each a tuple
    of floats of length 1 (L2). ``token_counts``: each input's tokens (after truncation);
    ``cached_tokens``: of them, how many the RAM cache served; ``pooling``: how the
    per-token states became one vector ("mean", "cls" or "last"); ``total_s``: from the
    engine taking the request on to its last vector."""

    vectors: tuple[tuple[float, ...], ...]
    token_counts: tuple[int, ...]
    cached_tokens: int = 0
    pooling: str = "mean"
    total_s: float = 0.0

    @property
    def prompt_tokens(self) -> int:
        """The tokens of all inputs together (OpenAI's ``usage.prompt_tokens``)."""
        return sum(self.token_counts)
