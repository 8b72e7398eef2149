"""The clients of ``radixchat bench soak`` (bench/soak.py): eight threads, each a
client of one dialect and one API key, holding conversations of a few turns until the run's
end, and the checker that sends a sample of their greedy requests to the server without a
cache and compares the replies.

Each client (:data:`PLANS`) keeps one conversation (a *thread*) at a time: chat and
messages clients re-send the history each turn; Responses clients continue a stored chain
(``store: true``, ``previous_response_id``) or a conversation (``conversation``). Some turns
offer tools (a tool call is answered with a result on the next turn), some stream, and a
share of the streams is dropped after a few events (the client closes the connection).
When a thread ends, a chain's last response or a conversation may be deleted. One client
pads its stored responses with metadata the model never reads, so its key's share of the
store fills and evicts while the other keys' must not.

A greedy thread is *mirrored* with probability ``mirror_share``: each of its turns, once
answered, goes to :class:`Mirror`, which sends the same request to the server without a
cache (one at a time, in order: a chain's ids are mapped to the ones that server made) and
counts a mismatch where the replies differ.

Failures are sorted by :class:`Restart`: a request that overlapped the server's restart
counts apart, and is sent again once the server is back; any other failure is counted by
kind and the client starts a new thread.
"""

from __future__ import annotations

import json
import queue
import random
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass

from bench.soak_wire import Clients, Reply, Step, error_kind

KEYS = ("soak-key-alpha-7f3a", "soak-key-bravo-19c2", "soak-key-charlie-5d8e")
MIRROR_KEY = "soak-key-reference-0b6d"  # the server without a cache's
MODEL = "default"
GREEDY_TEMPERATURE, SAMPLED_TEMPERATURE = 0.0, 0.8
TURNS = (2, 5)  # a thread's turns, at least and at most
MIRROR_QUEUE = 64  # turns waiting for the server without a cache; past it they go unchecked
MIRRORS = 1  # checkers, each for a part of the clients: the reference's requests at once
PAD_PAIRS, PAD_CHARS = 16, 500  # the padded client's metadata: stored, never read by the model
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city"],
    },
}
CONVERT = {
    "name": "convert_currency",
    "description": "Convert an amount between two currencies.",
    "parameters": {
        "type": "object",
        "properties": {
            "amount": {"type": "number"},
            "from": {"type": "string"},
            "to": {"type": "string"},
        },
        "required": ["amount", "from", "to"],
    },
}
OPENERS = (
    "What should I pack for a weekend in Lisbon?",
    "What is the weather in Paris today?",
    "How much is 120 euros in US dollars?",
    "Write a haiku about the sea.",
    "Give me three tips for learning Python.",
    "Explain what a prefix cache is, in two sentences.",
    "Suggest a name for a grey cat.",
    "What is the capital of Australia?",
)
FOLLOW_UPS = (
    "Tell me more.",
    "Can you make it shorter?",
    "And what about Berlin?",
    "Thanks. One more, please.",
    "Why?",
)


@dataclass(frozen=True)
class ClientPlan:
    """One client: its dialect (``chat``, ``messages``, ``responses`` for chains,
    ``conversations``), its key (an index into :data:`KEYS`), and the shares of its turns
    that stream, offer tools and are greedy; ``padded``: its stored responses carry
    metadata as large as OpenAI's limits let it be (~8 kB), which the model never reads."""

    name: str
    dialect: str
    key: int
    stream: float
    tools: float
    greedy: float
    padded: bool = False


PLANS = (
    ClientPlan("chat", "chat", 0, stream=0.0, tools=0.5, greedy=1.0),
    ClientPlan("chat-stream", "chat", 1, stream=1.0, tools=0.3, greedy=0.5),
    ClientPlan("messages", "messages", 2, stream=0.0, tools=0.5, greedy=1.0),
    ClientPlan("messages-stream", "messages", 0, stream=1.0, tools=0.3, greedy=0.5),
    ClientPlan("responses-chain", "responses", 1, stream=0.3, tools=0.4, greedy=1.0),
    ClientPlan("responses-padded", "responses", 1, 0.3, 0.0, 1.0, padded=True),
    ClientPlan("conversations", "conversations", 2, stream=0.3, tools=0.3, greedy=1.0),
    ClientPlan("responses-stream", "responses", 0, stream=1.0, tools=0.3, greedy=0.5),
)


class Restart:
    """When the server was down: from just before it was stopped until it answered again.
    ``up`` is set while it serves."""

    def __init__(self):
        self.began: float | None = None
        self.ended: float | None = None
        self.up = threading.Event()
        self.up.set()

    def begin(self) -> None:
        self.began = time.monotonic()
        self.up.clear()

    def end(self) -> None:
        self.ended = time.monotonic()
        self.up.set()

    def covers(self, start: float, end: float) -> bool:
        """Whether a request sent at ``start`` and over at ``end`` overlapped the gap."""
        if self.began is None:
            return False
        return end >= self.began and (self.ended is None or start <= self.ended)


class Tally:
    """Every request's outcome, and the replies compared, counted across the threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (dialect, outcome)
        self.errors: Counter[str] = Counter()  # outside the restart, by kind
        self.restart_errors: Counter[str] = Counter()  # overlapping the restart, by kind
        self.server_errors = 0  # outside the restart: 5xx, or an error event in a stream
        self.seconds: dict[str, list[float]] = {}  # whole replies, by dialect
        self.compared = 0
        self.mismatches: list[dict] = []
        self.unchecked: Counter[str] = Counter()  # mirrored turns not compared, by why

    def count(
        self,
        step: Step,
        outcome: str,
        seconds: float,
        kind: str | None = None,
        server_side: bool = False,
    ) -> None:
        with self.lock:
            self.outcomes[(step.dialect, outcome)] += 1
            if outcome == "failed":
                self.errors[kind] += 1
                self.server_errors += server_side
            elif outcome == "restart":
                self.restart_errors[kind] += 1
            elif outcome == "ok" and step.op in ("chat", "messages", "responses"):
                self.seconds.setdefault(step.dialect, []).append(seconds)

    def requests(self) -> tuple[int, int]:
        """Requests so far, and how many failed outside the restart."""
        with self.lock:
            total = sum(self.outcomes.values())
            return total, sum(n for (_, o), n in self.outcomes.items() if o == "failed")

    def report(self) -> dict:
        with self.lock:
            dialects = sorted({d for d, _ in self.outcomes})
            return {
                "requests": sum(self.outcomes.values()),
                "by_dialect": {
                    d: {o: n for (dd, o), n in sorted(self.outcomes.items()) if dd == d}
                    for d in dialects
                },
                "median_reply_s": {
                    d: round(statistics.median(s), 3) for d, s in sorted(self.seconds.items())
                },
                "errors": dict(self.errors.most_common()),
                "server_errors": self.server_errors,
                "restart_errors": dict(self.restart_errors.most_common()),
                "replies_compared": self.compared,
                "mismatches": len(self.mismatches),
                "mismatch_examples": self.mismatches[:5],
                "not_compared": dict(self.unchecked.most_common()),
            }


@dataclass
class _Mirrored:
    client: str
    thread: int
    turn: int
    step: Step
    reply: Reply


class Mirror(threading.Thread):
    """Sends mirrored turns to the server without a cache, one at a time in the order they
    came, and compares its replies with the cached server's."""

    def __init__(self, port: int, key: str, timeout_s: float, tally: Tally):
        super().__init__(name="soak-checker", daemon=True)
        self.tally = tally
        self.clients = Clients(port, key, timeout_s)
        self.waiting: queue.Queue[_Mirrored | None] = queue.Queue(MIRROR_QUEUE)
        self.ids: dict[str, str] = {}  # the cached server's ids -> the uncached server's
        self.broken: set[tuple[str, int]] = set()  # threads a turn of which went unchecked
        self.stop_by: float | None = None  # monotonic time past which the rest is not checked

    def offer(self, item: _Mirrored) -> bool:
        """Queue a turn; False (and counted) when the queue is full: the thread's later
        turns then cannot be checked either (a chain needs every link)."""
        try:
            self.waiting.put_nowait(item)
            return True
        except queue.Full:
            with self.tally.lock:
                self.tally.unchecked["the checker fell behind"] += 1
            return False

    def finish(self, stop_by: float) -> None:
        """Check what is queued until ``stop_by`` (monotonic), then stop."""
        self.stop_by = stop_by
        self.waiting.put(None)

    def run(self) -> None:
        try:
            while (item := self.waiting.get()) is not None:
                self._check(item)
        finally:
            self.clients.close()

    def _check(self, item: _Mirrored) -> None:
        reason = None
        if self.stop_by is not None and time.monotonic() > self.stop_by:
            reason = "the run ended first"
        elif (item.client, item.thread) in self.broken:
            reason = "an earlier turn of its thread went unchecked"
        if reason is None:
            body = _translate(item.step.body, self.ids)
            try:
                mine = self.clients.perform(Step(item.step.op, body))
            except Exception as exc:  # any failure of the reference: counted, not raised
                reason = f"the server without a cache failed: {error_kind(exc)[0]}"
            else:
                self._compare(item, mine)
                return
        self.broken.add((item.client, item.thread))
        with self.tally.lock:
            self.tally.unchecked[reason] += 1

    def _compare(self, item: _Mirrored, mine: Reply) -> None:
        if item.reply.made and mine.made:
            self.ids[item.reply.made] = mine.made
        for theirs, ours in zip(item.reply.tool_calls, mine.tool_calls, strict=False):
            self.ids[theirs.call_id] = ours.call_id
        if item.step.op == "conversation":
            return  # nothing to compare: a conversation made
        with self.tally.lock:
            self.tally.compared += 1
            if not item.reply.same_as(mine):
                self.tally.mismatches.append(
                    {
                        "client": item.client,
                        "turn": item.turn,
                        "dialect": item.step.dialect,
                        "cached": item.reply.summary(),
                        "uncached": mine.summary(),
                    }
                )


def _translate(body: dict, ids: dict[str, str]) -> dict:
    """``body`` with the cached server's ids (a previous response, a conversation, a tool
    call's) replaced by the uncached server's."""
    out = dict(body)
    for name in ("previous_response_id", "conversation", "id"):
        if name in out:
            out[name] = ids.get(out[name], out[name])
    if isinstance(out.get("input"), list):
        out["input"] = [
            {**item, "call_id": ids.get(item["call_id"], item["call_id"])}
            if isinstance(item, dict) and "call_id" in item
            else item
            for item in out["input"]
        ]
    return out


class SoakClient(threading.Thread):
    """One client of :data:`PLANS` until ``deadline`` (monotonic)."""

    def __init__(
        self,
        index: int,
        plan: ClientPlan,
        port: int,
        timeout_s: float,
        deadline: float,
        max_tokens: int,
        mirror_share: float,
        tally: Tally,
        restart: Restart,
        mirror: Mirror,
    ):
        super().__init__(name=f"soak-{plan.name}", daemon=True)
        self.plan, self.deadline, self.max_tokens = plan, deadline, max_tokens
        self.mirror_share, self.tally, self.restart, self.mirror = (
            mirror_share,
            tally,
            restart,
            mirror,
        )
        self.timeout_s = timeout_s
        self.rng = random.Random(index)
        self.clients = Clients(port, KEYS[plan.key], timeout_s)
        self.threads = 0

    def run(self) -> None:
        try:
            while time.monotonic() < self.deadline:
                self._thread()
        finally:
            self.clients.close()

    # one thread: a conversation of a few turns
    def _thread(self) -> None:
        self.threads += 1
        plan, rng = self.plan, self.rng
        greedy = rng.random() < plan.greedy
        mirrored = greedy and rng.random() < self.mirror_share
        history: list[dict] = []  # chat and messages: what is re-sent each turn
        pending: list[tuple] = []  # tool results owed on the next turn
        last_id = None  # responses: the chain's last response, or the conversation
        if plan.dialect == "conversations":
            step = Step("conversation", {"metadata": {"client": plan.name}})
            reply = self._send(step, mirrored)
            if reply is None:
                return
            last_id = reply.made
        for turn in range(rng.randint(*TURNS)):
            if time.monotonic() >= self.deadline:
                break
            step = self._turn(greedy, mirrored, history, pending, last_id, turn)
            reply = self._send(step, mirrored, turn)
            if reply is None:
                return  # failed: a new thread
            if reply.dropped:
                break  # the reply is unknown: the conversation cannot go on
            pending = list(reply.tool_calls)
            if plan.dialect in ("chat", "messages"):
                history += _answer(plan.dialect, step.body["messages"], reply)[len(history) :]
            elif plan.dialect == "responses":
                last_id = reply.made
        if last_id and not mirrored and rng.random() < 0.3:  # a thread the user deletes
            op = "delete_conversation" if plan.dialect == "conversations" else "delete_response"
            self._send(Step(op, {"id": last_id}), False)

    def _turn(self, greedy, mirrored, history, pending, last_id, turn) -> Step:
        plan, rng = self.plan, self.rng
        stream = not mirrored and rng.random() < plan.stream
        drop = rng.randint(2, 6) if stream and rng.random() < 0.35 else None
        tools = [WEATHER, CONVERT] if rng.random() < plan.tools else []
        text = rng.choice(OPENERS) if turn == 0 else rng.choice(FOLLOW_UPS)
        temperature = GREEDY_TEMPERATURE if greedy else SAMPLED_TEMPERATURE
        if plan.dialect == "chat":
            messages = history + (
                [_chat_result(c) for c in pending]
                if pending
                else [{"role": "user", "content": text}]
            )
            body = {
                "model": MODEL,
                "messages": messages,
                "max_tokens": self.max_tokens,
                "temperature": temperature,
            }
            if tools:
                body["tools"] = [{"type": "function", "function": t} for t in tools]
            return Step("chat", body, stream, drop)
        if plan.dialect == "messages":
            content = (
                [_anthropic_result(c) for c in pending]
                if pending
                else [{"type": "text", "text": text}]
            )
            body = {
                "model": MODEL,
                "messages": history + [{"role": "user", "content": content}],
                "max_tokens": self.max_tokens,
                "extra_body": {"temperature": temperature},
            }
            if tools:
                body["tools"] = [
                    {
                        "name": t["name"],
                        "description": t["description"],
                        "input_schema": t["parameters"],
                    }
                    for t in tools
                ]
            return Step("messages", body, stream, drop)
        items: list = [_response_result(c) for c in pending] or [
            {"type": "message", "role": "user", "content": text}
        ]
        body = {
            "model": MODEL,
            "input": items,
            "max_output_tokens": self.max_tokens,
            "temperature": temperature,
            "store": True,
        }
        if tools:
            body["tools"] = [{"type": "function", **t} for t in tools]
        if plan.padded:
            body["metadata"] = _padding(rng)
        if plan.dialect == "conversations":
            body["conversation"] = last_id
        elif last_id:
            body["previous_response_id"] = last_id
        return Step("responses", body, stream, drop)

    def _send(self, step: Step, mirrored: bool, turn: int = -1) -> Reply | None:
        """``step`` sent until it is answered, or fails outside a restart (None). A failure
        that overlapped the restart is counted apart and sent again once the server is up."""
        while True:
            began = time.monotonic()
            try:
                reply = self.clients.perform(step)
            except Exception as exc:  # every failure is a figure of the run
                ended = time.monotonic()
                kind, server_side = error_kind(exc)
                if self.restart.covers(began, ended):
                    self.tally.count(step, "restart", ended - began, kind, server_side)
                    self.restart.up.wait(self.timeout_s)
                    if time.monotonic() < self.deadline:
                        continue
                    return None
                self.tally.count(step, "failed", ended - began, kind, server_side)
                return None
            ended = time.monotonic()
            self.tally.count(step, "dropped" if reply.dropped else "ok", ended - began)
            if mirrored and step.op in ("chat", "messages", "responses", "conversation"):
                item = _Mirrored(self.plan.name, self.threads, turn, step, reply)
                if not self.mirror.offer(item):
                    self.mirror.broken.add((self.plan.name, self.threads))
            return reply


def _answer(dialect: str, sent: list[dict], reply: Reply) -> list[dict]:
    """The history after ``reply``: what was sent, then the assistant's turn."""
    if dialect == "chat":
        message: dict = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in reply.tool_calls
            ]
        return [*sent, message]
    blocks: list[dict] = [{"type": "text", "text": reply.text}] if reply.text else []
    blocks += [
        {"type": "tool_use", "id": c.call_id, "name": c.name, "input": _object(c.arguments)}
        for c in reply.tool_calls
    ]
    return [*sent, {"role": "assistant", "content": blocks or [{"type": "text", "text": "."}]}]


def _object(arguments: str) -> dict:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _tool_output(call) -> str:
    return f'{{"ok": true, "for": "{call.name}", "value": {len(call.arguments) % 37}}}'


def _chat_result(call) -> dict:
    return {"role": "tool", "tool_call_id": call.call_id, "content": _tool_output(call)}


def _anthropic_result(call) -> dict:
    return {"type": "tool_result", "tool_use_id": call.call_id, "content": _tool_output(call)}


def _response_result(call) -> dict:
    return {"type": "function_call_output", "call_id": call.call_id, "output": _tool_output(call)}


def _padding(rng: random.Random) -> dict[str, str]:
    """Metadata at OpenAI's limits: stored with the response, never read by the model."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return {f"pad{i:02d}": "".join(rng.choices(letters, k=PAD_CHARS)) for i in range(PAD_PAIRS)}
