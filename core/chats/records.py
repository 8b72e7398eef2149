"""What :class:`~core.chats.store.ChatStore` hands out: a chat session, a message, a damaged
row, and :func:`readable`, the messages a chat goes on from. Plain values."""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Session:
    id: int
    name: str  # the CLI's handle, unique: "work", "chat-20261129-175400"
    title: str | None  # shown in the GUI; defaults to the first user message
    system_prompt: str | None
    model: str | None
    settings: dict  # sampling settings: temperature, top_p, max_tokens, seed...
    created_at: float
    updated_at: float
    damaged: str | None = None  # what could not be read back (shown as read, with U+FFFD)
    # a branch (:meth:`ChatStore.branch_session`): the chat it was made from (None once that
    # is deleted) and how many of its messages it took
    parent_id: int | None = None
    fork_seq: int | None = None


@dataclass(frozen=True)
class Message:
    id: int
    session_id: int
    seq: int  # position in the session, from 1
    role: str  # "system" | "user" | "assistant"
    content: str
    stats: dict | None  # the engine's figures for an assistant turn
    created_at: float
    reasoning: str | None = None  # a reasoning model's thinking before the reply
    damaged: str | None = None  # what could not be read back (bad bytes shown as U+FFFD)
    # a regenerated reply's versions, oldest first (each {"content", "stats", "reasoning",
    # "tool_steps"}), and which one the chat goes on from (this row's content): () for a
    # reply of one version
    versions: tuple[dict, ...] = ()
    version: int = 0
    # a reply that used tools: its tool loop before ``content`` (the final answer), oldest
    # step first, as :mod:`core.chats.tool_steps` describes them; () for a plain reply
    tool_steps: tuple[dict, ...] = ()


@dataclass(frozen=True)
class Damage:
    """One damaged row, as :meth:`ChatStore.verify` lists it."""

    session_id: int
    session: str  # its name (bad bytes as U+FFFD)
    seq: int | None  # the message's position, or None for the session row itself
    problem: str

    def __str__(self) -> str:
        if not self.session_id:
            return self.problem  # the file as a whole
        where = f"message {self.seq}" if self.seq is not None else "the chat's own row"
        return f"chat {self.session!r} (id {self.session_id}), {where}: {self.problem}"


def readable(messages: list[Message]) -> tuple[list[Message], str | None]:
    """The messages a chat can go on from (those whose role was read back), and one line
    about the damaged ones, or None when there are none."""
    usable = [m for m in messages if m.role in ROLES]
    damaged = [m for m in messages if m.damaged]
    if not damaged:
        return usable, None
    left_out = len(messages) - len(usable)
    seqs = ", ".join(str(m.seq) for m in damaged[:5]) + (", …" if len(damaged) > 5 else "")
    return usable, (
        f"{len(damaged)} damaged message{'s' if len(damaged) > 1 else ''} in this chat "
        f"(number {seqs}): unreadable bytes are shown as \ufffd"
        + (f", {left_out} left out" if left_out else "")
        + "; `radixchat chats verify` lists them"
    )
