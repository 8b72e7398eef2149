"""Plain helpers of the engine tests (their fixtures are in conftest.py): a tiny model
loaded, a scheduler driven on the test's own thread, requests and their replies, an
engine started and ready, and the tools the tool tests offer (the API's tests use them
too)."""

from __future__ import annotations

from pathlib import Path

from core.engine.config import EngineConfig
from core.engine.engine import Engine, RequestHandle
from core.engine.handle import TokenizedRequest
from core.engine.prompt import render_prompt
from core.engine.scheduler import Scheduler
from core.engine.types import DoneEvent, GenerationRequest, SamplingParams
from core.models.load.chat_template import shipped_template
from core.models.load.loader import LoadedModel, load_model
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from core.paths import RESPONSES_FILE_FACTOR, stored_responses_budget
from kvcache.builder import build_kv_cache
from kvcache.store import SQLITE_PAGE_SIZE, StoreStats, pages_limit
from kvcache.tiered import TieredCache

# Two tools, as OpenAI's API takes them (a city's weather; the time in a zone).
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"enum": ["C", "F"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def anthropic_tool(tool: dict) -> dict:
    """An OpenAI tool as Anthropic's API takes it."""
    function = tool["function"]
    described = {"description": function["description"]} if "description" in function else {}
    return {"name": function["name"], **described, "input_schema": function["parameters"]}


def load_tiny(tmp_path_factory, kind: str, **spec) -> LoadedModel:
    """A tiny model of ``kind`` (a sliding window of 32 tokens where it has one), loaded."""
    path = write_tiny_model(
        tmp_path_factory.mktemp(kind) / "m", TinyModelSpec(kind=kind, sliding_window=32, **spec)
    )
    return load_model(str(path), tmp_path_factory.mktemp("data"))


def scheduler(loaded: LoadedModel, pool_tokens: int = 4096, **options) -> Scheduler:
    """A scheduler over a fresh cache of ``pool_tokens`` and no disk tier (``options``:
    the scheduler's own, e.g. ``batch_prefill``, ``pacer``, ``interleave``)."""
    build = build_kv_cache(
        loaded.model, weight_bytes=loaded.info.weight_bytes, pool_tokens=pool_tokens
    )
    return Scheduler(loaded, TieredCache(loaded.model, build), **options)


def handle(text: str, max_tokens: int = 20, **sampling) -> RequestHandle:
    """A greedy request for ``text`` (no chat template), not yet admitted."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, **sampling)
    return RequestHandle(GenerationRequest(prompt_text=text, sampling=params))


def done(h: RequestHandle) -> DoneEvent:
    """The DoneEvent that ended ``h`` (which must have ended)."""
    return last_done(list(h.events(timeout=0)))


def last_done(events: list) -> DoneEvent:
    """The last of ``events``, which must be a DoneEvent."""
    assert isinstance(events[-1], DoneEvent), events[-1]
    return events[-1]


def admit(s: Scheduler, h: RequestHandle) -> None:
    """Work ``h``'s prompt out (as a prompt thread does) and admit it to ``s``."""
    tokens = render_prompt(s.loaded.tokenizer, h.request)
    h.tokenized = TokenizedRequest(h.request, tuple(tokens), load=0)
    s.admit(h)


def start(s: Scheduler, h: RequestHandle) -> None:
    """Admit ``h`` and step until its prefill is done and it has its first token (the
    others decode meanwhile)."""
    admit(s, h)
    while any(job.state.handle is h for job in s.waiting):
        s.step()


def finish(s: Scheduler) -> None:
    """Step until every request has ended."""
    while s.busy:
        s.step()


def run_alone(s: Scheduler, h: RequestHandle) -> DoneEvent:
    start(s, h)
    finish(s)
    return done(h)


def no_locks(s: Scheduler) -> bool:
    """Whether no page is locked any more and the tree holds its invariants."""
    return s.cache.ram.stats().pages_locked == 0 and s.cache.ram.tree.check_invariants() is None


def start_engine(data: Path, model: Path, pool_tokens: int = 4096, **options) -> Engine:
    """An engine on ``model`` with its data in ``data``, started, its model loaded;
    ``options``: more of its :class:`EngineConfig`."""
    data.mkdir(parents=True, exist_ok=True)
    config = EngineConfig(pool_tokens=pool_tokens, **options)
    engine = Engine(data, str(model), config=config).start()
    engine.wait_ready(timeout=60)
    return engine


def start_tools_engine(data: Path, model: Path, template: str = "tools") -> Engine:
    """An engine for the tool tests: the shipped tool-capable template (``template``
    "tools") or the model's own, which takes no tools ("generic": the generic tool-call
    format, issue 30.2), room for tools in the pool, no disk cache (``model``: one with room
    for them, ``long_tiny_model``)."""
    chosen = shipped_template("smollm2_tools.jinja") if template == "tools" else None
    return start_engine(data, model, pool_tokens=16384, disk_cache=False, chat_template=chosen)


def counted(stats: StoreStats) -> int:
    """What a disk store's pages count against an engine's budget: each page's bytes and
    one SQLite page (``kvcache.store.pages_limit``)."""
    return stats.bytes + stats.pages * SQLITE_PAGE_SIZE


def folder_budget_for(pages: int) -> int:
    """The smallest data-folder disk budget whose KV cache's pages may count ``pages`` bytes
    (as :func:`counted`), the stored responses' room taken first and no derived files (a
    tiny model's), as ``Engine`` works it out."""
    low, high = 1, 2**44
    while low < high:
        folder = (low + high) // 2
        responses = RESPONSES_FILE_FACTOR * stored_responses_budget(folder)
        if pages_limit(max(folder - responses, folder // 4)) >= pages:
            high = folder
        else:
            low = folder + 1
    return low
