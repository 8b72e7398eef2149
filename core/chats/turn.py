"""What one chat turn does, for every front end (the ``radixchat chat`` command and the window).

A turn is a user message and its reply, in a stored chat session:

- ``ChatTurn.start`` reads the chat and builds what the model is asked: the session's
  system prompt, the stored history (less its last turn when the reply is to replace it:
  regenerate, edit) and the new user message.
- ``ChatTurn.finish`` decides what is stored when the reply ends: a reply stopped before
  any text is not stored, as if it was never sent; any other reply is stored with the
  engine's figures (appended, or replacing the last turn), so the store only changes once a
  reply is done and a failed or discarded reply loses nothing.
- ``ChatTurn.save`` is ``finish`` for a front end that shows the reply whatever happens:
  it never raises, says what became of the turn (:class:`SavedTurn`), and on a full disk
  lets the chat history win over the KV cache (the cache's files go, the turn is tried
  again).

A reply that used tools is stored with its tool loop (``tool_steps``, see
:mod:`core.chats.tool_steps`), and the model is asked it again the way it made it: each
step its calls and their results, then the final answer. While a loop runs,
``ChatTurn.loop_messages`` (and ``request(steps=...)``) is the prompt of its next step:
the turn's messages and the steps so far, so every step's prompt extends the last one's.

A chat whose stored messages read back damaged (:func:`~core.chats.store.readable`) goes
on from what was read: a message whose role could not be read is left out.

No mlx and no Qt here: the turn only reads and writes the chat store and builds the
engine's plain request values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from core.chats import tool_steps as steps
from core.chats.store import ChatStore, Message, Session, readable
from core.engine import namespaces
from core.engine.types import (
    CHAT_PRIORITY,
    ChatMessage,
    GenerationRequest,
    RequestStats,
    SamplingParams,
)
from core.errors import StoreError


def last_turn_start(messages: list[Message]) -> int:
    """Where the last turn starts: the last message, and the one before it unless the last
    is a user message (a turn is a user message and its reply)."""
    if not messages:
        return 0
    return max(0, len(messages) - (1 if messages[-1].role == "user" else 2))


@dataclass(frozen=True)
class MadeWith:
    """What a reply was made with, stored beside its figures (and exported with it): the
    model's name and the sampling settings."""

    model: str
    sampling: dict

    def figures(self) -> dict:
        return {"model": self.model, "sampling": dict(self.sampling)}


INTERRUPTED = "interrupted"  # a stored reply's finish_reason when RadixChat quit mid-reply


def engine_figures(figures) -> list[dict]:
    """Those of a chat's stored reply figures the engine made (its tokens counted; not a
    reply interrupted before they came, nor one stored with only what made it): the cache
    panel's turns."""
    return [
        f
        for f in figures
        if isinstance(f, dict)
        and ("prompt_tokens" in f or "completion_tokens" in f)
        and f.get("finish_reason") != INTERRUPTED
    ]


@dataclass(frozen=True)
class SavedTurn:
    """What became of a finished turn: ``stored`` or not; ``error``, one line, when it should
    have been and could not be (the reply is shown all the same); the bytes of KV cache
    deleted to make room for it."""

    stored: bool
    error: str | None = None
    cache_freed: int = 0


@dataclass(frozen=True)
class ChatTurn:
    """One turn in flight: what was asked, and what the stored chat looked like when it was."""

    session: Session
    prompt: str  # the user message
    replace: bool  # the reply replaces the stored last turn (regenerate, edit)
    stored: tuple[Message, ...]  # the stored chat when the turn started
    # the stored messages the turn follows (``stored`` less its last turn when replacing)
    kept: tuple[Message, ...]

    @classmethod
    def start(
        cls, store: ChatStore, session: Session, prompt: str, replace: bool = False
    ) -> ChatTurn:
        """A turn asking ``prompt`` after ``session``'s stored chat; raises StoreError when the
        chat cannot be read. ``session`` carries the system prompt to use."""
        stored = tuple(readable(store.messages(session.id))[0])
        kept = stored[: last_turn_start(list(stored))] if replace else stored
        return cls(session, prompt, replace, stored, kept)

    @property
    def history(self) -> tuple[ChatMessage, ...]:
        """What comes before the user message: the system prompt (if any), then the kept chat
        (a reply that used tools as its steps and its answer: :func:`tool_steps.expand`)."""
        system = (
            (ChatMessage("system", self.session.system_prompt),)
            if self.session.system_prompt
            else ()
        )
        return system + tuple(
            message
            for m in self.kept
            for message in steps.expand(m.role, m.content, m.reasoning, m.tool_steps)
        )

    @property
    def messages(self) -> tuple[ChatMessage, ...]:
        """What the model is asked: the history and the user message."""
        return self.history + (ChatMessage("user", self.prompt),)

    def loop_messages(self, tool_steps: tuple[dict, ...] = ()) -> tuple[ChatMessage, ...]:
        """What the model is asked at the next step of this turn's tool loop: the turn's
        messages, then the ``tool_steps`` made so far (each its calls and their results).
        Step k+1's prompt is step k's plus step k's calls and results: a prefix-cache hit."""
        return steps.loop_messages(self.messages, steps.checked(tool_steps))

    @property
    def kept_stats(self) -> list[dict]:
        """The engine's stored figures of the replies the turn follows, oldest first (a reply
        interrupted before the engine's figures came has none: no turn of its own); a reply
        that used tools has each step's figures before its own (one request each)."""
        return engine_figures(
            figures
            for m in self.kept
            if m.role == "assistant"
            for figures in (*(step.get("stats") for step in m.tool_steps), m.stats)
        )

    def request(
        self,
        sampling: SamplingParams,
        use_cache: bool = True,
        *,
        tool_steps: tuple[dict, ...] = (),
        tools: tuple[dict, ...] = (),
        tool_choice: str = "auto",
        tool_name: str | None = None,
    ) -> GenerationRequest:
        """The engine request for this turn, in the session's cache (the app's namespace). A
        person is watching it: it is prefilled before waiting API requests (``CHAT_PRIORITY``).
        In a tool loop: the steps made so far (``loop_messages``) and the ``tools`` the model
        may call (OpenAI style), with ``tool_choice`` and ``tool_name`` as the engine takes
        them."""
        return GenerationRequest(
            messages=self.loop_messages(tool_steps),
            sampling=sampling,
            session=self.session.name,
            use_cache=use_cache,
            cache_namespace=namespaces.APP,
            priority=CHAT_PRIORITY,
            tools=tuple(tools),
            tool_choice=tool_choice,
            tool_name=tool_name,
        )

    @staticmethod
    def keeps(
        text: str, stats: RequestStats | None, reasoning: str = "", tool_steps: tuple = ()
    ) -> bool:
        """Whether a reply that ended with ``text`` (and ``reasoning``, its thinking, and
        ``tool_steps``, its tool loop) is stored: not when it was stopped before any text,
        thinking or tool call (``stats`` None: it ended without the engine's figures, e.g.
        the window closed)."""
        stopped = stats is None or stats.finish_reason == "cancelled"
        return bool(text or reasoning or tool_steps) or not stopped

    def finish(
        self,
        store: ChatStore,
        text: str,
        stats: RequestStats | None,
        made_with: MadeWith | None = None,
        reasoning: str = "",
        tool_steps: tuple[dict, ...] = (),
    ) -> bool:
        """Store the turn with its reply (the thinking before it, and the tool loop before it:
        ``tool_steps``, whose ``stats`` are each step's), if ``keeps`` says so; True when it
        was stored. The reply's figures hold the engine's stats (its last request's) and
        what it was ``made_with``. Raises StoreError when the store fails (the chat goes on
        in memory), StepError (a ValueError) for steps that are not steps."""
        if not self.keeps(text, stats, reasoning, tool_steps):
            return False
        # no figures: it ended without the engine's, the window closed mid-reply
        figures = dataclasses.asdict(stats) if stats is not None else {"finish_reason": INTERRUPTED}
        if made_with is not None:
            figures = {**(figures or {}), **made_with.figures()}
        thought = reasoning or None
        save = store.replace_last_turn if self.replace else store.add_turn
        save(self.session.id, self.prompt, text, figures, thought, tool_steps)
        return True

    def save(
        self,
        store: ChatStore,
        text: str,
        stats: RequestStats | None,
        make_room: Callable[[], int] | None = None,
        made_with: MadeWith | None = None,
        reasoning: str = "",
        tool_steps: tuple[dict, ...] = (),
    ) -> SavedTurn:
        """``finish``, never raising: the caller shows the reply either way. When the store
        fails because the disk is full, the chat history wins: ``make_room`` (the engine's
        ``give_disk_space_back``: deletes the KV cache's files, returns the bytes freed)
        runs, and the turn is tried once more."""
        try:
            return SavedTurn(self.finish(store, text, stats, made_with, reasoning, tool_steps))
        except steps.StepError as exc:  # a front end's bug: said, never raised
            return SavedTurn(False, f"the reply's tool steps cannot be saved: {exc}")
        except StoreError as exc:
            if getattr(exc, "reason", None) != "full" or make_room is None:
                return SavedTurn(False, str(exc))
            freed = make_room()
            if not freed:
                return SavedTurn(False, str(exc))
        try:
            return SavedTurn(
                self.finish(store, text, stats, made_with, reasoning, tool_steps),
                cache_freed=freed,
            )
        except StoreError as exc:
            return SavedTurn(False, str(exc), freed)
