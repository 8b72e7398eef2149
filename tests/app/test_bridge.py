"""The bridge on its own, against a fake engine: what crosses to the GUI thread and when."""

from __future__ import annotations

import os
import threading

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QCoreApplication  # noqa: E402

from app.bridge import EngineBridge  # noqa: E402
from core.engine.engine import Engine, EngineStats, RequestHandle  # noqa: E402
from core.engine.types import CHAT_PRIORITY, DoneEvent, GenerationRequest, RequestStats, TokenEvent  # noqa: E402

PUBLIC = (
    "loadProgress",
    "modelLoading",
    "modelReady",
    "loadFailed",
    "progress",
    "token",
    "finished",
    "failed",
    "serverStopped",
    "statsUpdated",
)


class InstantEngine(Engine):
    """No thread: every request is answered at once."""

    def __init__(self, data_root):
        super().__init__(data_root, model_spec=None)

    def start(self) -> Engine:
        return self

    def submit(self, request: GenerationRequest) -> RequestHandle:
        handle = RequestHandle(request)
        handle._emit(TokenEvent("Hi"))
        handle._emit(
            DoneEvent("Hi", RequestStats(prompt_tokens=1, computed_tokens=1, completion_tokens=1))
        )
        handle._finish()
        return handle

    def shutdown(self, timeout: float = 10.0) -> None:
        """Nothing runs in the fake, so there is nothing to stop."""


def _join_workers() -> None:
    for thread in threading.enumerate():
        if thread.name.startswith("radixchat-bridge"):
            thread.join(30)


def test_nothing_is_emitted_after_shutdown(qtbot, tmp_path):
    bridge = EngineBridge(tmp_path, None, engine=InstantEngine(tmp_path))
    emitted = []
    for name in PUBLIC:
        getattr(bridge, name).connect(lambda *args, name=name: emitted.append(name))
    bridge.send([("user", "hello")], {"max_tokens": 4})
    bridge.shutdown()  # the reply's events are on their way to the GUI thread
    _join_workers()
    QCoreApplication.processEvents()
    bridge.poll_stats()
    assert emitted == []  # the window behind these slots may be gone, and its store closed


def test_a_reply_is_relayed_in_order(qtbot, tmp_path):
    bridge = EngineBridge(tmp_path, None, engine=InstantEngine(tmp_path))
    seen = []
    bridge.token.connect(lambda text: seen.append(("token", text)))
    with qtbot.waitSignal(bridge.finished, timeout=30000) as done:
        bridge.send([("user", "hello")], {"max_tokens": 4, "unknown": 1})
        assert bridge.busy
    assert seen == [("token", "Hi")] and done.args[0] == "Hi" and not bridge.busy
    bridge.shutdown()


def test_the_chat_windows_requests_go_before_api_requests(qtbot, tmp_path):
    engine = InstantEngine(tmp_path)
    sent = []
    answer = engine.submit
    engine.submit = lambda request: (sent.append(request), answer(request))[1]
    bridge = EngineBridge(tmp_path, None, engine=engine)
    with qtbot.waitSignal(bridge.finished, timeout=30000):
        bridge.send([("user", "hello")], {"max_tokens": 4})
    assert [r.priority for r in sent] == [CHAT_PRIORITY]
    bridge.shutdown()


def test_the_bridge_hands_out_the_engines_dataclasses(qtbot, tmp_path):
    """A reply's RequestStats and the engine's EngineStats cross as they are, not as dicts;
    the window's questions about the engine go through the bridge."""
    engine = InstantEngine(tmp_path)
    forgotten = []
    engine.forget_session = lambda session, namespace="": forgotten.append((session, namespace))
    bridge = EngineBridge(tmp_path, None, engine=engine)
    with qtbot.waitSignal(bridge.finished, timeout=30000) as done:
        bridge.send([("user", "hello")], {"max_tokens": 4})
    assert done.args[1] == RequestStats(prompt_tokens=1, computed_tokens=1, completion_tokens=1)
    with qtbot.waitSignal(bridge.statsUpdated, timeout=30000) as polled:
        bridge.poll_stats()
    assert (
        isinstance(polled.args[0], EngineStats)
        and polled.args[0].requests_served == engine.stats().requests_served
    )
    assert bridge.data_root == tmp_path and bridge.model_info is None
    bridge.forget_session("chat-1")
    assert forgotten == [("chat-1", "app")]
    bridge.shutdown()
