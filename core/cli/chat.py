"""``radixchat chat``: one turn, or an interactive loop, in a stored chat session."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from core import paths
from core.chats.settings import SAMPLING_KEYS, sampling_settings
from core.chats.store import ChatStore, Session, check_name, readable
from core.chats.turn import ChatTurn, MadeWith
from core.cli.commands.options import engine_config_of
from core.cli.progress import print_progress
from core.cli.terminal import safe, safe_text
from core.engine.engine import Engine
from core.engine.types import (
    DoneEvent,
    ErrorEvent,
    ReasoningEvent,
    RequestStats,
    SamplingParams,
    TokenEvent,
)
from core.errors import UserError

HELP = "commands: /stats (last turn's figures), /quit"
EXIT_NOT_SAVED = 2  # the reply was shown, but the turn is not in the chat history
DIM, NORMAL = "\x1b[2m", "\x1b[22m"  # the terminal's faint text, and back


class Thoughts:
    """A reasoning model's thinking as it streams, printed apart from the reply: on stderr
    (the reply alone goes to stdout, so ``radixchat chat Q > answer.txt`` keeps the answer
    only), dim on a terminal, between ``[thinking]`` and ``[/thinking]`` lines elsewhere."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.open = False

    def piece(self, text: str) -> None:
        if not self.open:
            self.open = True
            self.stream.write(DIM if self.tty else "[thinking]\n")
        self.stream.write(safe_text(text))
        self.stream.flush()

    def close(self) -> None:
        """The thinking ended (the reply's first text came, or the reply ended)."""
        if self.open:
            self.open = False
            self.stream.write(NORMAL + "\n" if self.tty else "\n[/thinking]\n")
            self.stream.flush()


def sampling_params(args) -> SamplingParams:
    """The sampling the flags ask for; a flag left out (None) keeps SamplingParams' default,
    the one copy of the defaults (the parser does not import the engine to read them)."""
    given = {key: getattr(args, key) for key in SAMPLING_KEYS}  # each key is a flag's dest
    try:
        return SamplingParams(
            **{k: v for k, v in given.items() if v is not None}, stop=tuple(args.stop)
        )
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def run_chat(args) -> int:
    # What the command line gave is checked before anything is made.
    if args.session is not None:
        check_name(args.session)
    if args.prompt is not None:
        _check_prompt(args.prompt)
    root = paths.data_dir(args.data_dir)
    sampling = sampling_params(args)
    config = engine_config_of(args)  # its --chat-template read: a bad file fails here
    with ChatStore(paths.chats_db_path(root)) as store:  # a newer or locked database fails first
        engine = Engine(
            root,
            args.model,
            config=config,
            weights_format=args.weights,
            on_load_progress=None if args.json else print_progress,
        )
        engine.start()
        try:
            engine.wait_ready()  # nothing is written before the model is there
            session = (
                store.get_or_create_session(args.session)
                if args.session
                else store.create_session()
            )
            if args.system is not None:
                store.update_session(session.id, system_prompt=args.system)
            _say_damage(store, session)
            if args.prompt is not None:
                return _turn(engine, store, session, args.prompt, sampling, args)
            return _loop(engine, store, session, sampling, args)
        finally:
            engine.shutdown()


def _say_damage(store: ChatStore, session: Session) -> None:
    """One line, once, when the chat read back damaged (it goes on from what was read)."""
    damage = readable(store.messages(session.id))[1]
    notes = [
        note
        for note in (damage, session.damaged and f"its settings row: {session.damaged}")
        if note
    ]
    if notes:
        print(
            f"radixchat: chat {safe(session.name)}: {'; '.join(notes)}", file=sys.stderr, flush=True
        )


def _check_prompt(text: str) -> None:
    """A prompt with bytes that were not UTF-8 (they reach Python as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(
            f"the message is not valid UTF-8 text (character {exc.start + 1}); nothing was sent"
        ) from exc


def _loop(engine, store, session, sampling, args) -> int:
    interactive = sys.stdin.isatty()
    if hasattr(sys.stdin, "reconfigure"):  # bad bytes reach _check_prompt, not a traceback
        sys.stdin.reconfigure(errors="surrogateescape")
    if interactive:
        print(f"session {safe(session.name)} — {HELP}", file=sys.stderr)
    last: RequestStats | None = None
    failed = False
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return 1 if failed else 0
        text = line.rstrip("\n")
        if not text.strip():
            continue
        if text.strip() == "/quit":
            return 0
        if text.strip() == "/stats":
            print(json.dumps(asdict(last) if last else {}), file=sys.stderr)
            continue
        try:
            _check_prompt(text)
            status, last = _run_turn(engine, store, session, text, sampling, args)
        except UserError as exc:  # this turn failed (too long...): the chat goes on
            print(f"radixchat: {safe(exc)}", file=sys.stderr, flush=True)
            failed = True
            continue
        failed = failed or bool(status)  # not saved: said so; the chat goes on


def _turn(engine, store, session, prompt, sampling, args) -> int:
    status, _ = _run_turn(engine, store, session, prompt, sampling, args)
    return status


def _run_turn(engine, store, session: Session, prompt: str, sampling, args):
    turn = ChatTurn.start(store, store.get_session_by_id(session.id) or session, prompt)
    handle = engine.submit(turn.request(sampling, use_cache=not args.no_cache))
    done: DoneEvent | None = None
    pieces: list[str] = []
    thought: list[str] = []
    thoughts = Thoughts()
    try:
        for event in handle.events():
            if isinstance(event, ReasoningEvent):
                thought.append(event.text)
                if not args.json:
                    thoughts.piece(event.text)
            elif isinstance(event, TokenEvent):
                pieces.append(event.text)
                if not args.json:
                    thoughts.close()
                    print(safe_text(event.text), end="", flush=True)
            elif isinstance(event, DoneEvent):
                done = event
            elif isinstance(event, ErrorEvent):
                raise UserError(event.message)
    except KeyboardInterrupt:
        handle.cancel()
        for event in handle.events():
            if isinstance(event, DoneEvent):
                done = event
    finally:
        thoughts.close()
    reply = done.text if done else "".join(pieces)
    reasoning = done.reasoning if done else "".join(thought)
    stats = done.stats if done else RequestStats(finish_reason="cancelled")
    # stopped before any text: not stored, as if never sent; a full disk: the cache gives way
    info = engine.model_info
    made_with = MadeWith(info.name if info else "", sampling_settings(sampling))
    saved = turn.save(
        store,
        reply,
        stats,
        make_room=engine.give_disk_space_back,
        made_with=made_with,
        reasoning=reasoning,
    )
    not_saved = saved.error
    if saved.cache_freed:
        print(
            (
                f"radixchat: the disk is full: the KV cache ({saved.cache_freed / paths.MB:.1f} "
                "MB) was deleted to save this turn"
            ),
            file=sys.stderr,
            flush=True,
        )
    if args.json:
        print(
            json.dumps(
                {
                    "reply": reply,
                    **({"reasoning": reasoning} if reasoning else {}),
                    "saved": not_saved is None,
                    **({"save_error": not_saved} if not_saved else {}),
                    "session": session.name,
                    "prompt_tokens": stats.prompt_tokens,
                    "cached_tokens": stats.cached_tokens,
                    "restored_tokens": stats.restored_tokens,
                    "computed_tokens": stats.computed_tokens,
                    "completion_tokens": stats.completion_tokens,
                    "reasoning_tokens": stats.reasoning_tokens,
                    "ttft_s": round(stats.ttft_s, 4),
                    "decode_tps": round(stats.decode_tps, 2),
                    "accepted_tokens": stats.accepted_tokens,
                    "finish_reason": stats.finish_reason,
                    "cache_namespace": stats.cache_namespace,
                }
            ),
            flush=True,
        )
    else:
        print(flush=True)
    if not_saved:
        print(
            f"radixchat: this turn was not saved to the chat history: {safe(not_saved)}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_NOT_SAVED, stats
    return 0, stats
