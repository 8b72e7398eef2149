"""The tool loop of the reply running in the window: each call shown, approved, run.

A chat uses the tools of the MCP servers it enables (:mod:`app.window_tools`). When the
model's reply makes calls, the window hands them to :class:`ToolLoop`: it adds the step to
the reply (the text the model wrote before its calls, then a card per call:
:mod:`app.tool_card`) and takes the calls one at a time. A call runs at once when the user
allowed that tool for this chat, or when its server's read-only tools are pre-allowed and
the server says the tool is read-only; otherwise its card waits for Allow, Allow for This
Chat, or Deny. When every call of the step has its result, ``stepDone`` tells the window to
ask the model again (the prompt: the previous one plus the calls and results,
``ChatTurn.loop_messages``). Stop cancels the running call and ends the loop.

Results are data for the model, never instructions to the app: nothing in a result changes
which servers a chat uses or which calls run without asking.

The hub's threads report a call's end through a queued signal, so everything here runs on
the GUI thread.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from shiboken6 import isValid

from app.tool_card import ALLOW_CHAT, DENY, ToolCallCard
from core.mcp.tools import ImagePart, ToolResult, ToolTable, failed

CALL_TIMEOUT_S = 120.0  # one tool call's longest run (the server is told to stop after it)


def result_dict(call_id: str, status: str, result: ToolResult | None) -> dict:
    """A call's result as a chat keeps it (core.chats.tool_steps)."""
    parts = []
    for part in result.parts if result is not None else ():
        if isinstance(part, ImagePart):
            data = base64.b64encode(part.data).decode("ascii")
            parts.append({"type": "image", "mime": part.mime, "data": data})
        else:
            parts.append({"type": "text", "text": part.text})
    return {"id": call_id, "status": status, "parts": parts}


@dataclass
class LoopState:
    """The running reply's loop: its chat, the tools it may call, the steps so far (the
    last one may still run), the RequestStats of each step's request."""

    session_id: int
    table: ToolTable
    read_only: set[tuple[str, str]]  # (server, tool) that run without asking
    allowed: set[str]  # "server/tool" the user allowed for this chat
    max_steps: int
    steps: list[dict] = field(default_factory=list)
    stats: list = field(default_factory=list)
    waiting: str | None = None  # the call id whose card waits for the user
    handle: object | None = None  # the running call's ToolCallHandle
    stopping: bool = False


class ToolLoop(QObject):
    """Runs the calls of each step (see the module docstring). ``hub``: a core.mcp McpHub;
    ``allow_for_chat(session_id, key)`` stores an Allow for This Chat ("server/tool")."""

    stepDone = Signal()  # every call of the last step has its result
    callStarted = Signal(str)  # a call runs (its id)
    _ended = Signal(str, object)  # (call id, ToolResult): from the hub's thread

    def __init__(self, hub, allow_for_chat: Callable[[int, str], None], parent=None):
        super().__init__(parent)
        self.hub = hub
        self.allow_for_chat = allow_for_chat
        self.state: LoopState | None = None
        self.cards: dict[str, ToolCallCard] = {}
        self._ended.connect(self._on_ended, Qt.ConnectionType.QueuedConnection)

    # ------------------------------------------------------------------ the loop
    def begin(self, state: LoopState | None) -> None:
        """A reply starts: ``state`` when its chat uses tools, else None."""
        self.state, self.cards = state, {}

    def end(self) -> tuple[dict, ...]:
        """The reply is over: its steps, as the chat keeps them."""
        steps = tuple(self.state.steps) if self.state is not None else ()
        self.state, self.cards = None, {}
        return steps

    @property
    def steps(self) -> tuple[dict, ...]:
        return tuple(self.state.steps) if self.state is not None else ()

    @property
    def limit_reached(self) -> bool:
        state = self.state
        return state is not None and len(state.steps) >= state.max_steps

    def takes(self, calls: tuple[dict, ...]) -> bool:
        """Whether the running reply's ``calls`` start a step (its chat uses tools)."""
        return bool(calls) and self.state is not None and not self.state.stopping

    def run_step(self, calls: tuple[dict, ...], text: str, thinking: str, stats, message) -> None:
        """The model's reply made ``calls`` after ``text``: the step is shown in ``message``
        (the streaming reply's widget, or None when its chat is not open) and its calls run."""
        state = self.state
        step_calls = []
        for call in calls:
            route = state.table.route(call["name"])
            server, tool = route if route is not None else (None, None)
            step_calls.append({**call, "server": server, "tool": tool})
        state.steps.append(
            {
                "content": text,
                "reasoning": thinking,
                "tool_calls": step_calls,
                "results": [],
                "stats": dataclasses.asdict(stats),
            }
        )
        state.stats.append(stats)
        if message is not None:
            self.show_cards(message, len(state.steps) - 1)
        self._next()

    def show_cards(self, message, index: int) -> None:
        """The cards of step ``index`` added to ``message`` (a chat's reply widget, shown
        again when its chat is opened mid-loop): finished calls with their results."""
        step = self.state.steps[index]
        results = {r["id"]: r for r in step["results"]}
        for call in step["tool_calls"]:
            if call["id"] in results:
                card = ToolCallCard.finished(call, results[call["id"]])
            else:
                card = ToolCallCard(
                    call["name"],
                    call["arguments"],
                    call.get("server"),
                    call.get("tool"),
                    read_only=(call.get("server"), call.get("tool")) in self.state.read_only,
                )
                if call["id"] != self.state.waiting:
                    card.set_state("running")
                card.decided.connect(lambda choice, i=call["id"]: self.decide(i, choice))
            self.cards[call["id"]] = card
            message.add_card(card)

    def show_all(self, message) -> None:
        """Every step so far, into ``message`` (its chat opened again mid-loop)."""
        if self.state is None:
            return
        for index, step in enumerate(self.state.steps):
            message.add_step_text(step["content"])
            self.show_cards(message, index)

    def decide(self, call_id: str, choice: str) -> None:
        """The user's answer to a waiting call (a card's buttons)."""
        state = self.state
        if state is None or state.waiting != call_id:
            return
        state.waiting = None
        call = self._call(call_id)
        if choice == DENY:
            self._record(call_id, "denied", None)
            return
        if choice == ALLOW_CHAT and call.get("server"):
            key = f"{call['server']}/{call['tool']}"
            state.allowed.add(key)
            self.allow_for_chat(state.session_id, key)
        self._run(call)

    def stop(self) -> bool:
        """Stop the loop (Stop, Esc): the running call is cancelled, a waiting one never
        runs. False when no call is running or waiting (the model is writing)."""
        state = self.state
        if state is None or not state.steps or self._step_over():
            return False
        state.stopping = True
        if state.handle is not None:
            state.handle.cancel()  # its end comes back as cancelled
        elif state.waiting is not None:
            waiting, state.waiting = state.waiting, None
            self._record(waiting, "cancelled", None)
        return True

    # ------------------------------------------------------------------ calls
    def _next(self) -> None:
        """Take the step's next call without a result, or say the step is done."""
        state = self.state
        step = state.steps[-1]
        done = {r["id"] for r in step["results"]}
        for call in step["tool_calls"]:
            if call["id"] in done:
                continue
            if state.stopping:
                self._record(call["id"], "cancelled", None)
                return
            if call.get("server") is None:
                names = ", ".join(sorted(state.table.routes)) or "none"
                text = f"There is no tool named {call['name']!r} here (tools: {names})."
                self._record(call["id"], "error", failed(text))
                return
            key = (call["server"], call["tool"])
            if f"{key[0]}/{key[1]}" in state.allowed or key in state.read_only:
                self._run(call)
            else:
                state.waiting = call["id"]
                card = self.cards.get(call["id"])
                if card is not None and isValid(card):
                    card.set_state("waiting")
            return
        QTimer.singleShot(0, self.stepDone.emit)  # after the caller's own work

    def _run(self, call: dict) -> None:
        state = self.state
        card = self.cards.get(call["id"])
        if card is not None and isValid(card):
            card.set_state("running")
        try:
            arguments = json.loads(call["arguments"] or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            text = f"The call's arguments are not a JSON object ({exc}); nothing ran."
            self._record(call["id"], "error", failed(text))
            return
        handle = self.hub.call(call["server"], call["tool"], arguments, timeout_s=CALL_TIMEOUT_S)
        state.handle = handle
        self.callStarted.emit(call["id"])
        handle.add_done_callback(lambda h, i=call["id"]: self._ended.emit(i, h.result(0)))

    def _on_ended(self, call_id: str, result: ToolResult) -> None:
        state = self.state
        if state is None or state.handle is None:
            return  # a call of a reply the window has let go
        state.handle = None
        if state.stopping:
            self._record(call_id, "cancelled", None)
        else:
            self._record(call_id, "error" if result.is_error else "ok", result)

    def _record(self, call_id: str, status: str, result: ToolResult | None) -> None:
        record = result_dict(call_id, status, result)
        self.state.steps[-1]["results"].append(record)
        card = self.cards.get(call_id)
        if card is not None and isValid(card):
            card.set_result(status, record["parts"])
        self._next()

    def _call(self, call_id: str) -> dict:
        return next(c for c in self.state.steps[-1]["tool_calls"] if c["id"] == call_id)

    def _step_over(self) -> bool:
        step = self.state.steps[-1]
        return len(step["results"]) == len(step["tool_calls"])
