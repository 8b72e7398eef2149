"""``radixchat bench agent``: the replayed session's shape and wire forms, and a whole run on a
tiny generated model (our server with and without its cache, and mlx_lm.server)."""

from __future__ import annotations

import json

from core.api.openai_schema import ChatCompletionRequest, to_call
from core.api.wire import ModelCard
from core.cli.bench.agent import _piece
from core.cli.bench.agent_trace import ROUNDS, anthropic_body, build_trace, openai_body
from core.cli.main import main
from core.models.chat_template import SMOLLM2_TOOLS_TEMPLATE
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from resources import resource_path

CARD = ModelCard("tiny", "0" * 64, 65536, frozenset({"tiny", "default"}), 0)


def test_the_trace_interleaves_two_agents_with_ten_tool_rounds_and_a_stop_turn():
    trace = build_trace()
    assert [r.agent for r in trace.requests] == [0, 1] * (ROUNDS + 2)
    for agent in (0, 1):
        requests = [r for r in trace.requests if r.agent == agent]
        results = [m for m in requests[-1].messages if m.role == "tool"]
        assert len(results) == ROUNDS and all(300 < len(m.text) < 700 for m in results)  # 105-282 SmolLM2 tokens
        assert [r.stop for r in requests] == [()] * (ROUNDS + 1) + [("\n",)]
        for before, after in zip(requests, requests[1:]):  # each request extends the one before
            assert after.messages[: len(before.messages)] == before.messages
    assert build_trace() == trace  # the same every run
    assert 4000 < len(trace.system) + len(json.dumps(trace.tools)) < 12000  # ~2,000 tokens


def test_the_openai_form_is_a_valid_request_with_its_calls_answered():
    trace = build_trace()
    for request in trace.requests:
        call = to_call(ChatCompletionRequest.model_validate(openai_body(trace, request, 8)), CARD)
        assert len(call.request.tools) == len(trace.tools) and call.stream
        assert call.request.sampling.stop == request.stop
        tools = [m for m in call.request.messages if m.role == "tool"]
        assert all(m.name for m in tools)  # each answers an earlier call, by its id


def test_the_anthropic_form_pairs_tool_use_and_tool_result():
    trace = build_trace()
    body = anthropic_body(trace, trace.requests[-1], 8)
    uses = [b["id"] for m in body["messages"] if isinstance(m["content"], list)
            for b in m["content"] if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for m in body["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b["type"] == "tool_result"]
    assert uses == results and len(uses) == ROUNDS and body["stop_sequences"] == ["\n"]


def test_stream_pieces_of_both_dialects():
    text, calls = [], {}
    assert not _piece("/v1/chat/completions", None, {"choices": [{"delta": {"role": "assistant"}}]}, text, calls)
    assert _piece("/v1/chat/completions", None, {"choices": [{"delta": {"content": "Hi"}}]}, text, calls)
    assert _piece("/v1/chat/completions", None, {"choices": [{"delta": {"tool_calls": [
        {"index": 0, "function": {"name": "f", "arguments": "{}"}}]}}]}, text, calls)
    assert text == ["Hi"] and calls == {0: {"name": "f", "input": "{}"}}
    text, calls = [], {}
    assert not _piece("/v1/messages", "ping", {"type": "ping"}, text, calls)
    assert _piece("/v1/messages", "content_block_delta",
                  {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
                  text, calls)
    assert text == ["Hi"]


def test_bench_agent_json_on_a_tiny_model(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "tiny", TinyModelSpec(num_layers=2, max_position_embeddings=32768))
    template = resource_path(SMOLLM2_TOOLS_TEMPLATE)
    argv = ["bench", "agent", "--model", str(model), "--rounds", "2", "--max-tokens", "4", "--json",
            "--chat-template", str(template), "--data-dir", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] == 8 and report["replies_identical"] is True
    assert list(report)[-3:] == ["ttft_sum_s", "ratio_ours_vs_ours_no_cache", "ratio_ours_vs_mlx_lm_server"]
    assert set(report["ttft_sum_s"]) == {"ours_cache", "ours_no_cache", "mlx_lm_server"}
    assert all(v > 0 for v in report["ttft_sum_s"].values())
    assert report["ratio_ours_vs_ours_no_cache"] > 0 and report["ratio_ours_vs_mlx_lm_server"] > 0
    assert all(len(run) == 8 for runs in report["ttft_s"].values() for run in runs)
