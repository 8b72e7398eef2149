"""What the main window does to ask for replies and receive them, one at a time.

:class:`ChatReplies` is a part of :class:`~app.main_window.MainWindow` (a mixin: it uses the
window's bridge, store, chat view, composer and status line). One reply runs at a time, in
any chat; a message sent meanwhile waits its turn (:class:`WaitingAsk`) and starts when the
running reply ends: in another chat it is shown there; in the chat whose reply streams, above
the message box (one per chat; Esc takes it back into the box). A reply whose chat is not
open goes on and is saved; opening its chat shows it streaming.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from app.bridge import EngineBridge
from app.chat_view import ChatView
from app.composer import Composer
from app.context_bar import ContextBar
from app.window_tools import WindowTools
from core.chats.store import ChatStore, Session, readable
from core.chats.turn import INTERRUPTED, ChatTurn, MadeWith
from core.engine.types import RequestStats
from core.errors import StoreError
from core.paths import MB

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WaitingAsk:
    """A message sent while another chat's reply ran: it starts when that reply ends."""

    session_id: int
    text: str
    replace: bool
    from_composer: bool
    shown: bool = True  # in its chat; False: above the composer (its chat's own reply runs)


@dataclass
class LiveFigures:
    """The running reply's figures as it streams: its prompt's tokens (from the prefill's
    progress), the tokens decoded so far and when, for the live speed and context."""

    prompt: int = 0
    tokens: int = 0
    first_at: float | None = None  # monotonic time of the first decoded token
    last_at: float = 0.0
    shown_at: float = 0.0  # when the speed was last shown (at most 4 times a second)

    def rate(self) -> float | None:
        """Tokens a second since the first token (None before a second token)."""
        if self.first_at is None or self.tokens < 2 or self.last_at <= self.first_at:
            return None
        return (self.tokens - 1) / (self.last_at - self.first_at)


SPEED_EVERY_S = 0.25  # the live speed's refresh


def shown(messages) -> list[tuple]:
    """Stored messages as the chat view takes them: (role, content, thinking, thinking
    tokens, note, versions, tool steps), the count and the note from the reply's stored
    figures, versions as (the one shown, how many) for a regenerated reply (else None)."""
    return [
        (
            m.role,
            m.content,
            m.reasoning or "",
            int((m.stats or {}).get("reasoning_tokens") or 0),
            reply_note(m.stats) if m.role == "assistant" and m.stats else "",
            (m.version, len(m.versions)) if m.versions else None,
            m.tool_steps,
        )
        for m in messages
    ]


def reply_note(figures: dict, stopped: bool = False) -> str:
    """The dim note under a reply, from its stored figures (``RequestStats`` and
    ``MadeWith``'s): what made it (the model, the temperature) and its figures."""
    parts = []
    if figures.get("model"):
        parts.append(str(figures["model"]))
    sampling = figures.get("sampling") or {}
    if isinstance(sampling, dict) and isinstance(sampling.get("temperature"), int | float):
        parts.append(f"temperature {sampling['temperature']:g}")
    if figures.get("finish_reason") == INTERRUPTED:
        parts.append("interrupted: RadixChat quit mid-reply")
    elif stopped or figures.get("finish_reason") == "cancelled":
        parts.append("stopped")
    tokens, tps = figures.get("completion_tokens"), figures.get("decode_tps")
    if isinstance(tokens, int):
        parts.append(f"{tokens} tokens")
    if isinstance(tps, int | float) and tps > 0:
        parts.append(f"{tps:.1f} tok/s")
    ttft = figures.get("ttft_s")
    if isinstance(ttft, int | float) and ttft > 0:
        parts.append(f"TTFT {ttft:.2f} s")
    return " · ".join(parts)


def chat_title(turn: ChatTurn, chars: int = 40) -> str:
    """The chat of ``turn`` as the status line names it: its title, else (a new chat, titled
    once its first reply is saved) the start of the message."""
    text = turn.session.title or " ".join(turn.prompt.split())
    return text if len(text) <= chars else text[: chars - 1] + "…"


class ChatReplies:
    """Sending, stopping, queueing and receiving replies (see the module docstring)."""

    bridge: EngineBridge
    store: ChatStore
    chat: ChatView
    composer: Composer
    session: Session | None
    model_name: str
    _turn: ChatTurn | None  # the reply running now (in any chat)
    _from_composer: bool  # it came from the composer (not a regenerate)
    _reply: str  # what it streamed so far
    _thinking: str  # the thinking it streamed so far (a reasoning model's)
    _made_with: MadeWith | None  # its model and sampling, stored with it
    _waiting: list[WaitingAsk]  # messages that wait for it, in order
    _live: LiveFigures  # its figures as it streams
    _calls: tuple  # the tool calls its last request made (toolCalls comes before finished)
    tools: WindowTools  # MCP servers and the running reply's tool loop
    context_bar: ContextBar

    def _show_pending(self, session_id: int) -> None:
        """Show the reply this chat is running or the message it has waiting."""
        if self._turn is not None and self._turn.session.id == session_id:
            self._show_asked(self._turn)
            if self._thinking:
                self.chat.append_thinking(self._thinking)
            if self._reply:
                self.chat.append_reply(self._reply)
            return
        waiting = self._waiting_in(session_id)
        if waiting is not None:
            try:
                turn = self._make_turn(waiting)
            except StoreError:
                return
            self._show_asked(turn)
            self._set_state_text(self._waits_text(), 0)

    def _show_asked(self, turn: ChatTurn) -> None:
        self.chat.set_messages(shown(turn.kept))
        self.chat.add_user_message(turn.prompt)
        self.chat.begin_reply()
        if self._turn is turn:  # a tool loop's steps so far, with their live cards
            self.tools.loop.show_all(self.chat.streaming_message())

    # ------------------------------------------------------------------ chatting
    def send(self, text: str) -> None:
        """Send ``text`` from the composer: a new turn, or (while editing) the last turn's
        replacement."""
        self._ask(text, replace=self.composer.editing, from_composer=True)

    def regenerate(self) -> None:
        """Ask again for the last reply: the new one replaces the last turn once it is done."""
        if self.session is None or not self.model_name or self._busy(self.session.id):
            return
        try:
            messages = readable(self.store.messages(self.session.id))[0]
        except StoreError as exc:
            self._set_state_text(f"Could not read the chat: {exc}")
            return
        if len(messages) < 2 or messages[-1].role != "assistant":
            return
        self._ask(messages[-2].content, replace=True, from_composer=False)

    def stop_reply(self) -> None:
        """Take back the open chat's waiting message (Esc, Stop), else stop its reply, or
        cancel an edit."""
        session_id = self.session.id if self.session is not None else None
        waiting = self._waiting_in(session_id)
        if waiting is not None:
            self._waiting.remove(waiting)
            if not waiting.shown:  # above the box: back into it, before what was typed since
                self.composer.take_back(waiting.text)
            else:
                try:
                    self._give_back(self._make_turn(waiting), waiting.from_composer)
                except StoreError as exc:
                    self._set_state_text(f"Could not read the chat: {exc}")
            self._set_state_text("The waiting message was taken back", 5000)
            self._update_state()
        elif self._turn is not None and self._turn.session.id == session_id:
            if self.tools.loop.stop():  # a tool call runs or waits: it ends the loop
                self._set_state_text("Stopping the tool call…", 0)
            else:
                self.bridge.cancel()
        else:
            self.composer.cancel_edit()

    def _ask(self, text: str, replace: bool, from_composer: bool) -> None:
        """Ask for a reply to ``text`` after the stored chat (less its last turn when
        ``replace``): now, or once the reply running in another chat ends. The store only
        changes when the reply is done (``ChatTurn.finish``), so a reply that fails or is
        stopped before its first token loses nothing."""
        if not text or not self.model_name or self.bridge.loading or self.session is None:
            return
        if self._waiting_in(self.session.id) is not None:  # the box keeps the text
            self._set_state_text("A message already waits in this chat (Esc takes it back)", 5000)
            return
        if self._turn is not None and self._turn.session.id == self.session.id:
            self._queue_behind_reply(text, replace, from_composer)
            return
        ask = WaitingAsk(self.session.id, text, replace, from_composer)
        try:
            turn = self._make_turn(ask)
            # a bad setting is said here, before the window changes (events arrive queued)
            self.bridge.sampling_params(self.sampling())
        except StoreError as exc:
            self._set_state_text(f"Could not read the chat: {exc}")
            return
        except ValueError as exc:
            self._set_state_text(f"Check the chat settings: {exc}")
            return
        if self._turn is not None or self.bridge.busy:
            self._waiting.append(ask)
            self._show_sent(turn, from_composer, waiting=True)
            self._set_state_text(self._waits_text(), 0)
            self._update_state()
            return
        self._start(turn, from_composer)

    def _queue_behind_reply(self, text: str, replace: bool, from_composer: bool) -> None:
        """Sent in the chat whose reply streams: it goes once the reply ends (its turn is made
        then, after the reply is stored), shown above the box meanwhile."""
        if replace:  # an edit of the last message: that turn is the one still running
            self._set_state_text("Send the edit once the reply ends (or Esc stops it)", 5000)
            return
        self._waiting.append(WaitingAsk(self.session.id, text, False, from_composer, shown=False))
        if from_composer:
            self.composer.input.clear()
        self._set_state_text("Sends once this reply ends (Esc takes it back)", 5000)
        self._update_state()

    def _start(
        self, turn: ChatTurn, from_composer: bool, shown: bool = False, clear_box: bool = True
    ) -> bool:
        """Send ``turn`` to the engine; ``shown``: the open chat shows it already (it waited
        its turn there). False when a setting is refused."""
        self.tools.loop.begin(self.tools.loop_state(turn.session))
        try:
            self.bridge.send(
                turn.messages,
                self.sampling(turn.session),
                session=turn.session.name,
                **self.tools.request_args(turn.session, 0),
            )
        except ValueError as exc:
            self.tools.loop.end()
            self._set_state_text(f"Check the chat settings: {exc}")
            return False
        self._turn, self._from_composer, self._reply, self._thinking = turn, from_composer, "", ""
        self._live = LiveFigures()
        self._made_with = MadeWith(self.model_name, self.sampling(turn.session))
        if self._visible(turn):
            if not shown:
                self._show_sent(turn, from_composer and clear_box)
            self._set_state_text("Reading the prompt…", 0)
        self._update_state()
        return True

    def _show_sent(self, turn: ChatTurn, from_composer: bool, waiting: bool = False) -> None:
        """The open chat once ``turn`` is sent (``waiting``: it waits its turn): the message,
        and the reply to come."""
        if from_composer:
            self.composer.finish_edit()
            self.composer.input.clear()
        errors = any(self.chat.message_role(i) == "error" for i in range(self.chat.message_count()))
        if waiting or turn.replace or errors:
            self._show_asked(turn)  # the chat as it will be stored (no error rows)
        else:
            self.chat.add_user_message(turn.prompt)
            self.chat.begin_reply()

    def _start_next(self) -> None:
        """The running reply ended: start the first message that waits for it."""
        while self._waiting and self._turn is None and not self.bridge.busy:
            ask = self._waiting.pop(0)
            try:
                turn = self._make_turn(ask)
            except StoreError as exc:
                self._set_state_text(f"A waiting message could not be sent: {exc}")
                continue
            # queued above the box: the box holds what was typed since, left as it is
            if self._start(turn, ask.from_composer, shown=ask.shown, clear_box=ask.shown):
                continue
            if not ask.shown and self._visible(turn):  # a setting refused: back into the box
                self.composer.take_back(ask.text)
            elif self._visible(turn):
                self._give_back(turn, ask.from_composer)
        self._update_state()

    def _make_turn(self, ask: WaitingAsk) -> ChatTurn:
        session = self.store.get_session_by_id(ask.session_id)
        if session is None:
            raise StoreError("the chat was deleted")
        return ChatTurn.start(self.store, session, ask.text, replace=ask.replace)

    @property
    def _generating(self) -> bool:
        """A reply is running (in any chat)."""
        return self._turn is not None

    def _busy(self, session_id: int | None) -> bool:
        """The chat's reply runs or its message waits."""
        running = self._turn is not None and self._turn.session.id == session_id
        return running or self._waiting_in(session_id) is not None

    def _waiting_in(self, session_id: int | None) -> WaitingAsk | None:
        return next((ask for ask in self._waiting if ask.session_id == session_id), None)

    def _visible(self, turn: ChatTurn) -> bool:
        return self.session is not None and self.session.id == turn.session.id

    def _waits_text(self) -> str:
        title = chat_title(self._turn) if self._turn is not None else ""
        return f"Waits for the reply in “{title}” to end (Esc takes it back)"

    def _give_back(self, turn: ChatTurn, from_composer: bool) -> None:
        """Undo the message sent in the window: the chat as stored, the text back in the
        composer."""
        if not self._visible(turn):
            return
        if turn.replace:
            self.chat.set_messages(shown(turn.stored))
        else:
            self.chat.remove_last_turn()
        if from_composer:  # nothing lost: it can be sent again, before what was typed since
            if turn.replace and not self.composer.text():
                self.composer.start_edit(turn.prompt)
            else:
                self.composer.take_back(turn.prompt)

    def _show_context(self, stats: list) -> None:
        """The context bar for a chat whose replies have these stored figures (dicts)."""
        last = stats[-1] if stats else {}
        get = last.get if isinstance(last, dict) else lambda key, default=0: getattr(last, key)
        used = int(get("prompt_tokens", 0) or 0) + int(get("completion_tokens", 0) or 0)
        info = self.bridge.model_info
        self.context_bar.set_usage(used, info.context_length if info is not None else 0)

    def _on_decoded(self, count: int) -> None:
        """Tokens of the running reply: the live speed and context (the open chat's)."""
        if self._turn is None:
            return
        live, now = self._live, time.monotonic()
        if live.first_at is None:
            live.first_at = now
        live.tokens += count
        live.last_at = now
        if not self._visible(self._turn):
            return
        self.context_bar.set_usage(live.prompt + live.tokens, self.context_bar.context)
        rate = live.rate()
        if rate is not None and now - live.shown_at >= SPEED_EVERY_S:
            live.shown_at = now
            self.speed_label.setText(f"{rate:.1f} tok/s")
            self.speed_label.setToolTip("The reply's decode speed so far")

    def _on_prefill_progress(self, done: int, total: int) -> None:
        if self._turn is not None:
            self._live.prompt = total
            if self._visible(self._turn):
                self.context_bar.set_usage(total, self.context_bar.context)
        if self._turn is not None and self._visible(self._turn) and done < total:
            self._set_state_text(f"Reading the prompt: {done} of {total} tokens", 0)

    def _on_token(self, text: str) -> None:
        if self._turn is None:
            return
        self._reply += text
        if self._visible(self._turn):
            if self.state_label.text() != "Generating…":
                self._set_state_text("Generating…", 0)
            self.chat.append_reply(text)

    def _on_thinking(self, text: str) -> None:
        if self._turn is None:
            return
        self._thinking += text
        if self._visible(self._turn):
            if self.state_label.text() != "Thinking…":
                self._set_state_text("Thinking…", 0)
            self.chat.append_thinking(text)

    def _on_tool_calls(self, calls: tuple) -> None:
        self._calls = tuple(calls)  # finished follows: a step of the tool loop

    def _on_finished(self, text: str, stats: RequestStats) -> None:
        calls, self._calls = self._calls, ()
        loop = self.tools.loop
        if self._turn is not None and stats.finish_reason != "cancelled" and loop.takes(calls):
            turn, thinking = self._turn, self._thinking
            self._reply, self._thinking = "", ""
            message = self.chat.end_step(text) if self._visible(turn) else None
            loop.run_step(calls, text, thinking, stats, message)
            if self._visible(turn):
                self.cache_panel.set_turns(turn.kept_stats + list(loop.state.stats))
                self._set_state_text(f"Tool step {len(loop.steps)}: the model called a tool", 0)
            return
        turn, self._turn, self._reply = self._turn, None, ""
        thinking, self._thinking = self._thinking, ""
        if turn is None:  # a reply the window stopped waiting for (closed, chat deleted)
            loop.end()
            self._start_next()
            return
        self._finish_turn(turn, text, stats, thinking)
        self._start_next()

    def _on_step_done(self) -> None:
        """Every call of the loop's step has its result: ask the model again (the prompt:
        the last one and the calls and results), or end the loop (stopped, or its limit)."""
        turn, loop = self._turn, self.tools.loop
        if turn is None or loop.state is None:
            return
        if loop.state.stopping or loop.limit_reached:
            why = "stopped" if loop.state.stopping else f"the limit of {loop.state.max_steps} steps"
            self._turn = None
            self._end_loop(turn, f"tool loop ended: {why}")
            self._start_next()
            return
        try:
            self.bridge.send(
                turn.loop_messages(loop.steps),
                self.sampling(turn.session),
                session=turn.session.name,
                **self.tools.request_args(turn.session, len(loop.steps)),
            )
        except (ValueError, RuntimeError) as exc:
            self._turn = None
            self._end_loop(turn, f"tool loop ended: {exc}")
            self._start_next()
            return
        if self._visible(turn):
            self._set_state_text("Reading the tool results…", 0)

    def _end_loop(self, turn: ChatTurn, note: str) -> None:
        """A tool loop ended with no answer after its last step: the steps are kept."""
        steps = self.tools.loop.end()
        if self._visible(turn):
            self.chat.end_reply("", note)
            self._set_state_text(note[0].upper() + note[1:])
        saved = turn.save(
            self.store,
            "",
            None,
            make_room=self.bridge.give_disk_space_back,
            made_with=self._made_with,
            tool_steps=steps,
        )
        if saved.error:
            self._set_state_text(f"This reply is shown but was not saved: {saved.error}")
        self._after_saved(turn)

    def _finish_turn(self, turn: ChatTurn, text: str, stats: RequestStats, thinking: str) -> None:
        visible = self._visible(turn)
        stopped = stats.finish_reason == "cancelled"
        step_stats = list(self.tools.loop.state.stats) if self.tools.loop.state else []
        steps = self.tools.loop.end()
        if not turn.keeps(text, stats, thinking, steps):  # stopped before its first token
            self._give_back(turn, self._from_composer)
            self._set_state_text("Stopped before the reply began")
            return
        made = self._made_with.figures() if self._made_with is not None else {}
        note = reply_note({**dataclasses.asdict(stats), **made}, stopped)
        # speculative decoding: reply tokens per decode step, where drafts were taken
        per_step = f" · {stats.tokens_per_step:.2f} tok/step" if stats.accepted_tokens else ""
        self.speed_label.setText(f"{stats.decode_tps:.1f} tok/s{per_step}")
        self.speed_label.setToolTip("The last reply's decode speed")
        if visible:
            self._show_context([stats])
            self.chat.end_reply(text, note, thinking, stats.reasoning_tokens)
            self.cache_panel.set_turns(turn.kept_stats + step_stats + [stats])
            served = stats.cached_tokens + stats.restored_tokens
            self._set_state_text(
                f"{'Stopped' if stopped else 'Done'} · prompt {stats.prompt_tokens} tokens, "
                f"{served} from the cache · TTFT {stats.ttft_s:.2f} s"
            )
        else:
            self._set_state_text(f"The reply in “{chat_title(turn)}” is done")
        saved = turn.save(
            self.store,
            text,
            stats,
            make_room=self.bridge.give_disk_space_back,
            made_with=self._made_with,
            reasoning=thinking,
            tool_steps=steps,
        )
        if saved.error:  # the reply stays shown; the chat goes on in memory
            self._set_state_text(f"This reply is shown but was not saved: {saved.error}")
            return
        if visible and saved.stored and turn.replace:
            self._show_versions(turn)
        if saved.cache_freed:
            self._set_state_text(
                f"The disk is full: the KV cache ({saved.cache_freed / MB:.1f} MB) "
                "was deleted to save this reply"
            )
        self._after_saved(turn)

    def _after_saved(self, turn: ChatTurn) -> None:
        """The chat list and title follow a stored reply."""
        visible = self._visible(turn)
        if self.session is None:
            return
        try:
            self.session = self.store.get_session_by_id(self.session.id) or self.session
            if visible:
                self.sessions.refresh(select_id=self.session.id)
            else:  # another chat's reply: its row moves up, never under the pointer
                self.sessions.refresh_when_away()
            self._update_title()
        except StoreError as exc:
            self._set_state_text(f"Could not read the chats: {exc}")

    def _keep_on_close(self) -> None:
        """The window closes: waiting messages go (never sent, nothing stored); the running
        reply stops and what came so far is stored (its tool steps too), as Stop does."""
        self._waiting.clear()
        if self._turn is None:
            return
        turn, self._turn = self._turn, None
        self.bridge.cancel()
        try:  # nothing yet: nothing stored
            turn.finish(
                self.store,
                self._reply,
                None,
                self._made_with,
                self._thinking,
                tool_steps=self.tools.loop.end(),
            )
        except StoreError as exc:
            log.warning("the reply being written when the window closed is lost: %s", exc)

    def _on_chat_tools_saved(self, session_id: int) -> None:
        """A chat's tool choice was saved (the Tools menu): the open chat reads it again."""
        if self.session is not None and self.session.id == session_id:
            try:
                self.session = self.store.get_session_by_id(session_id) or self.session
            except StoreError:  # the store said so already; the next reply reads it again
                pass

    def _show_versions(self, turn: ChatTurn) -> None:
        """A regenerated reply, stored: its ‹ n/n › (the replies it replaced are kept)."""
        try:
            stored = readable(self.store.messages(turn.session.id))[0]
        except StoreError:
            return
        count = self.chat.message_count()
        if stored and stored[-1].versions and count:
            self.chat.message_widget(count - 1).set_versions(
                stored[-1].version, len(stored[-1].versions)
            )

    def _on_failed(self, message: str) -> None:
        turn, self._turn, self._reply, self._thinking = self._turn, None, "", ""
        self._calls = ()
        if turn is not None and self.tools.loop.steps:  # mid-loop: the steps so far are kept
            self._end_loop(turn, f"tool loop ended: {message}")
            self._start_next()
            return
        self.tools.loop.end()
        if turn is not None:
            if self._visible(turn):
                self._give_back(turn, self._from_composer)
                self.chat.add_error(message)
                self._set_state_text(f"Error: {message}")
            else:
                title = chat_title(turn)
                self._set_state_text(f"The reply in “{title}” failed: {message}")
        self._start_next()
