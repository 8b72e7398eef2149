"""Which waiting prompt takes the next prefill chunk, and how many one client may queue.

The order: by priority first (the chat window's turns, ``CHAT_PRIORITY``, before every API
request; an API request may only ask to wait longer), then round robin between clients,
then arrival. Among the prompts at the lowest priority waiting, the next chunk goes to the
client served least recently, and within a client to its earliest prompt. A client is a
request's cache namespace less any salt (``core.engine.namespaces.owner``): one API key,
the API without keys, the app's own chats. So a long prompt half prefilled yields, one
chunk at a time, to another key's short prompt, which then waits for one chunk at most
(``core.engine.pacing`` keeps a chunk near its budget even while nobody decodes); a key's
queue of prompts goes in one at a time, in arrival order, taking turns with the other
keys'. A client's own priorities order its prompts too: priority is global, as vLLM's is.

:meth:`PrefillTurns.order` puts the whole waiting list in that order (the first prompt of
every client, the client served least recently first, then the second of each, and so on),
so the batched prefill (``core.engine.batch_prefill``) groups prompts in turn as well.

Why priority before the round robin rather than after: the chat window's turns must go
before API requests (a person is watching them), and a key that asks to wait longer
(``priority`` 5 for a background job) is not served as soon as one that does not.

Each client may have at most ``max_waiting`` prompts waiting (admitted, not yet decoding);
one more is refused at once (:class:`core.errors.TooManyWaitingError`, a 429 in the API)
rather than held for as long as the client's queue ahead of it takes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from core.errors import TooManyWaitingError
from core.limits import MAX_WAITING_PER_KEY

# clients whose last turn is remembered; past it the least recently served are forgotten,
# which changes nothing: a client never served goes first among those waiting, as they would
REMEMBERED_CLIENTS = 4096


@dataclass(frozen=True)
class Turn:
    """A waiting prompt's place: its client, its priority (lower first), its arrival."""

    client: str
    priority: int
    arrival: int


class Waiting(Protocol):
    turn: Turn


W = TypeVar("W", bound=Waiting)


@dataclass(frozen=True)
class PrefillSharing:
    """How a scheduler shares prefill between clients: ``max_waiting`` prompts a client may
    queue; ``round_robin`` False: the order before the round robin (priority, then arrival)
    and whole chunks while nobody decodes, so benches can measure both on the same weights."""

    max_waiting: int = MAX_WAITING_PER_KEY
    round_robin: bool = True


DEFAULT_SHARING = PrefillSharing()  # frozen: one is shared


class PrefillTurns:
    """The prefill order of one scheduler's waiting prompts (engine thread only).

    ``round_robin`` False: today's order before the round robin (priority, then arrival;
    the scheduler adds the client with fewest requests decoding), kept so that ``radixchat
    bench key-fairness`` can measure both on the same weights in one run."""

    def __init__(self, max_waiting: int = MAX_WAITING_PER_KEY, round_robin: bool = True):
        if max_waiting < 1:
            raise ValueError("max_waiting must be at least 1")
        self.max_waiting = max_waiting
        self.round_robin = round_robin
        self._last_served: dict[str, int] = {}  # client -> the tick of its last chunk
        self._tick = 0

    def order(self, waiting: Iterable[W]) -> list[W]:
        """``waiting`` in turn: by priority; within a priority the first prompt of each
        client (the client served least recently first), then the second of each, ...;
        within a client by arrival."""
        ranks: dict[tuple[str, int], int] = {}
        keyed = []
        for job in sorted(waiting, key=lambda job: (job.turn.priority, job.turn.arrival)):
            turn = job.turn
            rank = ranks.get((turn.client, turn.priority), 0)
            ranks[(turn.client, turn.priority)] = rank + 1
            last = self._last_served.get(turn.client, -1)
            keyed.append(((turn.priority, rank, last, turn.arrival), job))
        keyed.sort(key=lambda pair: pair[0])
        return [job for _, job in keyed]

    def served(self, client: str) -> None:
        """``client``'s prompt took a chunk (or a batched prefill): the others go first now."""
        self._tick += 1
        self._last_served[client] = self._tick
        if len(self._last_served) > REMEMBERED_CLIENTS:
            oldest = sorted(self._last_served, key=self._last_served.__getitem__)
            for forgotten in oldest[: len(oldest) // 2]:
                del self._last_served[forgotten]

    def check_room(self, client: str, waiting: Iterable[Waiting]) -> None:
        """Raise TooManyWaitingError if ``client`` has ``max_waiting`` prompts ``waiting``."""
        queued = sum(1 for job in waiting if job.turn.client == client)
        if queued >= self.max_waiting:
            raise TooManyWaitingError(
                f"too many requests waiting: this API key (or client) has {queued} prompts "
                f"queued for prefill and the server queues at most {self.max_waiting} a key "
                "(radixchat serve --max-waiting N); retry when one has started"
            )
