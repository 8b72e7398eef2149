"""Stand-ins and helpers for the main-window tests: a fake engine with the real interface,
and small steps (wait for the model, make a chat greedy, send a turn) that wait on signals."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.bridge import EngineBridge
from core.engine.engine import Engine, RequestHandle
from core.engine.types import DoneEvent, GenerationRequest, RequestStats, TokenEvent
from core.errors import UserError
from core.models.load.loader import ModelInfo

WAIT_MS = 60000
GREEDY = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 16, "seed": None}


def _info(name: str = "fake-model") -> ModelInfo:
    return ModelInfo(
        spec=name,
        name=name,
        path="/fake",
        model_type="llama",
        fingerprint="0" * 16,
        weights_format="float32",
        weight_bytes=1000,
        context_length=512,
        num_layers=1,
        load_seconds=0.0,
    )


class FakeEngine(Engine):
    """The real interface without a thread: scripted loads and scripted replies."""

    def __init__(
        self,
        data_root,
        load_error: str | None = None,
        events: tuple = (),
        switch_error: str | None = None,
    ):
        super().__init__(data_root, model_spec=None)
        self.load_error, self.events, self.switch_error = load_error, events, switch_error
        self.requests: list[GenerationRequest] = []
        self.forgotten: list[tuple[str, str]] = []  # (session, cache namespace)
        self._info = None if load_error else _info()

    def start(self) -> Engine:
        return self

    def wait_ready(self, timeout: float | None = None) -> ModelInfo:
        if self.load_error is not None:
            raise UserError(self.load_error)
        return self._info

    def load(
        self, spec: str, weights_format: str = "auto", timeout: float | None = None
    ) -> ModelInfo:
        if self.switch_error is not None:
            raise UserError(self.switch_error)
        self._info = _info(spec)
        return self._info

    def submit(self, request: GenerationRequest) -> RequestHandle:
        self.requests.append(request)
        handle = RequestHandle(request)
        for event in self.events:
            handle.emit(event)
        handle.finish()
        return handle

    def forget_session(self, session: str, namespace: str = "") -> None:
        self.forgotten.append((session, namespace))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Nothing runs in the fake, so there is nothing to stop."""


class HeldHandle(RequestHandle):
    """A held reply: Stop (cancel) ends it with what it streamed so far, as the engine does."""

    def __init__(self, request: GenerationRequest):
        super().__init__(request)
        self.streamed = ""
        self.ended = False

    def stream(self, text: str) -> None:
        self.streamed += text
        self.emit(TokenEvent(text))

    def end(self, event) -> None:
        if not self.ended:
            self.ended = True
            self.emit(event)
            self.finish()

    def cancel(self) -> None:
        super().cancel()
        self.end(
            DoneEvent(
                self.streamed,
                RequestStats(
                    prompt_tokens=4,
                    computed_tokens=4,
                    completion_tokens=len(self.streamed),
                    finish_reason="cancelled",
                ),
            )
        )


class ScriptedEngine(FakeEngine):
    """Replies "reply N" at once; with ``hold`` set, the test streams and ends each reply."""

    def __init__(self, data_root, hold: bool = False):
        super().__init__(data_root)
        self.hold = hold
        self.handles: list[HeldHandle] = []
        self.replies: list = []  # events to end the next replies with (default: "reply N")

    def submit(self, request: GenerationRequest) -> RequestHandle:
        self.requests.append(request)
        handle = HeldHandle(request)
        self.handles.append(handle)
        if not self.hold:
            text = f"reply {len(self.requests)}"
            handle.end(
                self.replies.pop(0)
                if self.replies
                else DoneEvent(
                    text, RequestStats(prompt_tokens=4, computed_tokens=4, completion_tokens=2)
                )
            )
        return handle


def wait_ready(qtbot, bridge: EngineBridge) -> str:
    with qtbot.waitSignal(bridge.modelReady, timeout=WAIT_MS) as ready:
        bridge.start()
    return ready.args[0]


def make_greedy(window, store, **changes) -> None:
    store.update_session(window.session.id, settings={**GREEDY, **changes})
    window.session = store.get_session_by_id(window.session.id)


def send_turn(qtbot, window, bridge, text: str) -> tuple[str, dict]:
    window.composer.input.setPlainText(text)
    with qtbot.waitSignal(bridge.finished, timeout=WAIT_MS) as done:
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    return done.args[0], done.args[1]
