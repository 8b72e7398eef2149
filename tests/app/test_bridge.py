"""The bridge on its own, against a fake engine (what crosses to the GUI thread and when),
and a tool call on the tiny model (its calls delivered, the next step a cache hit)."""

from __future__ import annotations

import json
import os
import threading

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QCoreApplication  # noqa: E402

from app.bridge import EngineBridge  # noqa: E402
from core.engine.config import EngineConfig  # noqa: E402
from core.engine.engine import Engine, EngineStats, RequestHandle  # noqa: E402
from core.engine.types import (  # noqa: E402
    CHAT_PRIORITY,
    ChatMessage,
    DoneEvent,
    GenerationRequest,
    RequestStats,
    TokenEvent,
    ToolCall,
)
from tests.core.engine.helpers import WEATHER  # noqa: E402

PUBLIC = (
    "loadProgress",
    "modelLoading",
    "modelReady",
    "loadFailed",
    "progress",
    "token",
    "toolCalls",
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
        handle.emit(TokenEvent("Hi"))
        handle.emit(
            DoneEvent("Hi", RequestStats(prompt_tokens=1, computed_tokens=1, completion_tokens=1))
        )
        handle.finish()
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


# -- tools (issue 46) --

# the engine tests' tool (a short city, an enum: a forced call always ends)
CALL = ToolCall("call_1", "get_weather", '{"city": "Paris", "unit": "C"}')


class CallingEngine(InstantEngine):
    """Answers every request with one tool call, and keeps the requests."""

    def __init__(self, data_root):
        super().__init__(data_root)
        self.requests: list[GenerationRequest] = []

    def submit(self, request: GenerationRequest) -> RequestHandle:
        self.requests.append(request)
        handle = RequestHandle(request)
        handle.emit(DoneEvent("", RequestStats(finish_reason="tool_calls"), tool_calls=(CALL,)))
        handle.finish()
        return handle


def test_tools_go_to_the_engine_and_the_calls_come_back_before_finished(qtbot, tmp_path):
    engine = CallingEngine(tmp_path)
    bridge = EngineBridge(tmp_path, None, engine=engine)
    seen = []
    bridge.toolCalls.connect(lambda calls: seen.append(("toolCalls", calls)))
    bridge.finished.connect(lambda text, stats: seen.append(("finished", stats.finish_reason)))
    history = [
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "", (CALL,)),
        ChatMessage("tool", "18C", tool_call_id="call_1", name="get_weather"),
        ("assistant", "It is 18C.", "Paris, then."),  # the tuple form still works beside them
        ("user", "And tomorrow?"),
    ]
    with qtbot.waitSignal(bridge.finished, timeout=30000):
        bridge.send(
            history,
            {"max_tokens": 8},
            "chat",
            tools=(WEATHER,),
            tool_choice="function",
            tool_name="get_weather",
        )
    (request,) = engine.requests
    assert request.messages == (
        *history[:3],
        ChatMessage("assistant", "It is 18C.", reasoning="Paris, then."),
        ChatMessage("user", "And tomorrow?"),
    )
    assert request.tools == (WEATHER,) and request.session == "chat"
    assert (request.tool_choice, request.tool_name) == ("function", "get_weather")
    assert seen == [
        (
            "toolCalls",
            (
                {
                    "id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris", "unit": "C"}',
                },
            ),
        ),
        ("finished", "tool_calls"),
    ]
    with qtbot.waitSignal(bridge.finished, timeout=30000):  # without tools: plain as before
        bridge.send([("user", "hi")], {"max_tokens": 4})
    assert engine.requests[-1].tools == () and engine.requests[-1].tool_choice == "auto"
    try:
        bridge.send([("user", "hi")], {}, tool_choice="sometimes")
        raise AssertionError("a tool choice the engine refuses is refused")
    except ValueError:
        assert not bridge.busy
    bridge.shutdown()


def test_a_forced_call_on_the_tiny_model_and_its_result_a_cache_hit(
    qtbot, tmp_path, long_tiny_model
):
    """The tiny model (its ChatML template takes no tools: the generic format) must call the
    tool (tool_choice "function": constrained decoding); the calls arrive with JSON
    arguments; the next step, the call and its result after the same prompt, is served
    from the cache up to where the first step's prompt ended."""
    config = EngineConfig(pool_tokens=16384, disk_cache=False)
    bridge = EngineBridge(tmp_path, str(long_tiny_model), config=config)
    calls, done = [], []
    bridge.toolCalls.connect(calls.append)
    bridge.finished.connect(lambda text, stats: done.append((text, stats)))
    with qtbot.waitSignal(bridge.modelReady, timeout=120000):
        bridge.start()
    greedy = {"temperature": 0.0, "max_tokens": 160}  # the call takes ~90 (bytes)
    asked = [ChatMessage("system", "Be brief."), ChatMessage("user", "Weather in Paris?")]
    with qtbot.waitSignal(bridge.finished, timeout=120000):
        bridge.send(
            asked,
            greedy,
            "weather",
            tools=(WEATHER,),
            tool_choice="function",
            tool_name="get_weather",
        )
    (made,) = calls
    assert len(made) == 1 and made[0]["name"] == "get_weather" and made[0]["id"]
    arguments = json.loads(made[0]["arguments"])
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("C", "F")
    first = done[0][1]
    assert first.finish_reason == "tool_calls" and first.prompt_tokens > 0
    step = [
        ChatMessage("assistant", done[0][0], (ToolCall(**made[0]),)),
        ChatMessage("tool", "18C, sunny", tool_call_id=made[0]["id"], name="get_weather"),
    ]
    with qtbot.waitSignal(bridge.finished, timeout=120000):
        bridge.send([*asked, *step], {**greedy, "max_tokens": 4}, "weather", tools=(WEATHER,))
    second = done[1][1]
    assert second.prompt_tokens > first.prompt_tokens
    assert second.cached_tokens >= first.prompt_tokens - 1 > 0, (first, second)
    assert second.computed_tokens < second.prompt_tokens - first.prompt_tokens + 2
    bridge.shutdown()
