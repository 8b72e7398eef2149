"""``radixchat --self-test``: is this install (or this app bundle) able to chat?

Headless and self-contained: in a temporary folder it writes a tiny generated model,
runs one greedy chat turn through the engine and the prefix cache, saves the session to
the disk store, restarts the engine on the same folder and asks the session's second
turn, which must come back from disk (``restored_tokens > 0``); then that turn again
from the RAM cache and once more with no cache at all, which must give the same reply
token for token. It prints one line and returns 0, or prints which stage broke and
returns 1. Nothing is written to the user's data folder or next to the program: the
temporary folder lives in the system's temp folder (inside ``--data-dir`` when one is
given) and is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from core import paths
from core.engine.config import EngineConfig
from core.engine.types import ChatMessage, DoneEvent, ErrorEvent, GenerationRequest, SamplingParams

log = logging.getLogger(__name__)

SESSION = "self-test"
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
CONSTRAINED_SAMPLING = SamplingParams(temperature=0.0, max_tokens=48)
CONSTRAINED_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
POOL_TOKENS = 4096
READY_TIMEOUT_S = 120.0
FIRST_QUESTION = "Hello! This is RadixChat's self-test. Please say something."
SECOND_QUESTION = "Thanks. Once more, please."


class SelfTestFailure(Exception):
    """One stage of the self-test failed; ``stage`` names it."""

    def __init__(self, stage: str, detail: str):
        super().__init__(detail)
        self.stage = stage


@dataclass(frozen=True)
class SelfTestReport:
    mlx: str  # "mlx 0.32.4 (cpu, OpenBLAS)"
    turn1_prompt: int
    turn1_cached: int
    turn2_prompt: int
    turn2_restored: int
    seconds: float

    def line(self) -> str:
        return (
            f"radixchat self-test: ok · {self.mlx} · turn 1: {self.turn1_prompt} prompt tokens, "
            f"{self.turn1_cached} cached · turn 2 after restart: {self.turn2_restored} of "
            f"{self.turn2_prompt} restored from disk · {self.seconds:.1f} s"
        )


def run_self_test(args: argparse.Namespace) -> int:
    """The ``--self-test`` command: one line on stdout; 0 if everything works, else 1."""
    started = time.perf_counter()
    parent = getattr(args, "data_dir", None)
    try:
        if parent:
            Path(parent).expanduser().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(
            prefix="radixchat-self-test-", dir=parent, ignore_cleanup_errors=True
        ) as work:
            report = _run(Path(work), started)
    except SelfTestFailure as exc:
        log.debug("self-test failed at %s", exc.stage, exc_info=True)
        print(f"radixchat self-test: FAILED at {exc.stage}: {exc}", flush=True)
        return 1
    except Exception as exc:  # the temporary folder itself: unwritable temp, disk full
        print(f"radixchat self-test: FAILED at temporary folder: {_one_line(exc)}", flush=True)
        return 1
    print(report.line(), flush=True)
    return 0


@contextmanager
def _stage(name: str) -> Iterator[None]:
    """Turn any error inside into a SelfTestFailure that names this stage."""
    try:
        yield
    except SelfTestFailure:
        raise
    except Exception as exc:
        log.debug("self-test stage %s raised", name, exc_info=True)
        raise SelfTestFailure(name, _one_line(exc)) from exc


def _check(stage: str, ok: bool, detail: str) -> None:
    if not ok:
        raise SelfTestFailure(stage, detail)


def _run(work: Path, started: float) -> SelfTestReport:
    with _stage("mlx"):
        mlx = _describe_mlx()
    with _stage("tiny model"):
        from core.models.tiny_model import TinyModelSpec, write_tiny_model

        model = str(write_tiny_model(work / "tiny-llama", TinyModelSpec(num_layers=2)))
    data = work / "data"
    data.mkdir()  # as paths.data_dir() makes it for the app

    first = _start(data, model, "engine start")
    try:
        history = [ChatMessage("user", FIRST_QUESTION)]
        turn1 = _ask(first, history, "turn 1")
        s1 = turn1.stats
        _check("turn 1", bool(turn1.text), "the reply is empty")
        _check(
            "turn 1",
            s1.prompt_tokens > 0 and s1.completion_tokens > 0,
            f"odd stats: {s1.prompt_tokens} prompt, {s1.completion_tokens} completion tokens",
        )
        _check(
            "turn 1",
            s1.cached_tokens == 0 and s1.restored_tokens == 0,
            f"a fresh cache served {s1.cached_tokens} + {s1.restored_tokens} tokens",
        )
        _check(
            "turn 1",
            s1.computed_tokens == s1.prompt_tokens,
            f"computed {s1.computed_tokens} of {s1.prompt_tokens} prompt tokens",
        )
        with _stage("disk save"):
            _check(
                "disk save",
                first.disk_cache_error is None,
                f"disk cache off: {first.disk_cache_error}",
            )
            first.flush_disk_cache()
            _check(
                "disk save",
                paths.kv_cache_db_path(data).is_file(),
                f"no {paths.KV_CACHE_DB} was written",
            )
    finally:
        with _stage("engine shutdown"):
            first.shutdown()

    history += [ChatMessage("assistant", turn1.text), ChatMessage("user", SECOND_QUESTION)]
    second = _start(data, model, "engine restart")
    try:
        turn2 = _ask(second, history, "turn 2 after restart")
        s2 = turn2.stats
        _check(
            "disk restore",
            s2.restored_tokens > 0,
            f"nothing restored from disk ({s2.cached_tokens} cached, {s2.computed_tokens} computed "
            f"of {s2.prompt_tokens}; disk cache: {second.disk_cache_error or 'on'})",
        )
        again = _ask(second, history, "turn 2 from the RAM cache")
        _check(
            "determinism",
            again.text == turn2.text,
            f"greedy replies differ: {turn2.text!r} then {again.text!r}",
        )
        _check(
            "RAM cache", again.stats.cached_tokens > 0, "the repeated turn was not served from RAM"
        )
        plain = _ask(second, history, "turn 2 without cache", use_cache=False)
        _check(
            "determinism",
            plain.text == turn2.text,
            f"the cached reply {turn2.text!r} differs from the uncached {plain.text!r}",
        )
        _check_constrained(second, history)
    finally:
        with _stage("engine shutdown"):
            second.shutdown()

    return SelfTestReport(
        mlx=mlx,
        turn1_prompt=s1.prompt_tokens,
        turn1_cached=s1.cached_tokens,
        turn2_prompt=s2.prompt_tokens,
        turn2_restored=s2.restored_tokens,
        seconds=time.perf_counter() - started,
    )


def _check_constrained(engine, history: list[ChatMessage]) -> None:
    """A reply held to a JSON schema (the grammar library and the schema checker load, and
    the random tiny model can only write what the schema allows)."""
    import jsonschema

    request = GenerationRequest(
        messages=tuple(history), sampling=CONSTRAINED_SAMPLING, json_schema=CONSTRAINED_SCHEMA
    )
    with _stage("constrained output"):
        events = list(engine.stream(request))
    last = events[-1] if events else None
    if isinstance(last, ErrorEvent):
        raise SelfTestFailure("constrained output", last.message)
    _check(
        "constrained output",
        isinstance(last, DoneEvent) and last.stats.finish_reason == "stop",
        f"the reply did not finish: {last!r}",
    )
    try:
        jsonschema.validate(json.loads(last.text), CONSTRAINED_SCHEMA)
    except (ValueError, jsonschema.ValidationError) as exc:
        raise SelfTestFailure(
            "constrained output", f"{last.text!r} does not fit its schema: {exc}"
        ) from None


def _start(data: Path, model: str, stage: str):
    from core.engine.engine import Engine

    with _stage(stage):
        engine = Engine(data, model, config=EngineConfig(pool_tokens=POOL_TOKENS)).start()
        try:
            engine.wait_ready(READY_TIMEOUT_S)
        except BaseException:
            engine.shutdown()
            raise
    return engine


def _ask(engine, history: list[ChatMessage], stage: str, use_cache: bool = True) -> DoneEvent:
    request = GenerationRequest(
        messages=tuple(history), sampling=GREEDY, session=SESSION, use_cache=use_cache
    )
    with _stage(stage):
        events = list(engine.stream(request))
    last = events[-1] if events else None
    if isinstance(last, ErrorEvent):
        raise SelfTestFailure(stage, last.message)
    _check(
        stage,
        isinstance(last, DoneEvent),
        f"the stream ended without a reply ({type(last).__name__})",
    )
    return last


def _describe_mlx() -> str:
    """``mlx 0.32.4 (cpu, OpenBLAS)``: the version, the device and, on Linux, the BLAS."""
    import mlx.core as mx

    from core.cpu_setup import blas_setup

    device = "gpu" if mx.default_device() == mx.gpu else "cpu"
    details = [device]
    if device == "cpu":
        details.append("OpenBLAS" if blas_setup().library else "bundled BLAS")
    return f"mlx {mx.__version__} ({', '.join(details)})"


def _one_line(exc: BaseException) -> str:
    """``Type: message``, on one line, with the root cause when there is one (an
    ImportError from a compiled extension says little without the error under it)."""

    def describe(error: BaseException) -> str:
        text = " ".join(str(error).split())
        return f"{type(error).__name__}: {text}" if text else type(error).__name__

    line, root, seen = describe(exc), exc, {id(exc)}
    while (root.__cause__ or root.__context__) is not None and id(
        root.__cause__ or root.__context__
    ) not in seen:
        root = root.__cause__ or root.__context__
        seen.add(id(root))
    return line if root is exc else f"{line} (from {describe(root)})"
