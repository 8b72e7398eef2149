"""``radixchat bench agent``: the replayed session's shape and wire forms, and a whole run on a
tiny generated model (our server with and without its cache, and mlx_lm.server)."""

from __future__ import annotations

import json

from bench import agent
from bench.agent import CHAT, MESSAGES, Reply, Served, _piece, _usage, replay_interleaved
from bench.agent_trace import ROUNDS, anthropic_body, build_trace, openai_body
from core.api.openai_schema import ChatCompletionRequest, to_call
from core.api.wire import ModelCard
from core.cli.main import main
from core.models.load.chat_template import SMOLLM2_TOOLS_TEMPLATE
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from resources import resource_path

CARD = ModelCard("tiny", "0" * 64, 65536, frozenset({"tiny", "default"}), 0)


def test_the_trace_interleaves_two_agents_with_ten_tool_rounds_and_a_stop_turn():
    trace = build_trace()
    assert [r.agent for r in trace.requests] == [0, 1] * (ROUNDS + 2)
    for who in (0, 1):
        requests = [r for r in trace.requests if r.agent == who]
        results = [m for m in requests[-1].messages if m.role == "tool"]
        # 105-282 SmolLM2 tokens
        assert len(results) == ROUNDS and all(300 < len(m.text) < 700 for m in results)
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
    uses = [
        b["id"]
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    results = [
        b["tool_use_id"]
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_result"
    ]
    assert uses == results and len(uses) == ROUNDS and body["stop_sequences"] == ["\n"]


def test_stream_pieces_of_both_dialects():
    text, calls = [], {}
    assert not _piece(
        "/v1/chat/completions", None, {"choices": [{"delta": {"role": "assistant"}}]}, text, calls
    )
    assert _piece(
        "/v1/chat/completions", None, {"choices": [{"delta": {"content": "Hi"}}]}, text, calls
    )
    assert _piece(
        "/v1/chat/completions",
        None,
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]
                    }
                }
            ]
        },
        text,
        calls,
    )
    assert text == ["Hi"] and calls == {0: {"name": "f", "input": "{}"}}
    text, calls = [], {}
    assert not _piece("/v1/messages", "ping", {"type": "ping"}, text, calls)
    assert _piece(
        "/v1/messages",
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        text,
        calls,
    )
    assert text == ["Hi"]


def test_usage_of_both_dialects_gives_prompt_and_cached_tokens():
    usage = {}
    _usage(
        MESSAGES,
        {
            "type": "message_start",
            "message": {"usage": {"input_tokens": 30, "cache_read_input_tokens": 70}},
        },
        usage,
    )
    assert usage == {"prompt": 100, "cached": 70}
    _usage(
        MESSAGES,
        {
            "type": "message_delta",
            "usage": {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 4},
        },
        usage,
    )
    assert usage == {"prompt": 100, "cached": 90}  # the final figures win
    usage = {}
    _usage(CHAT, {"choices": [{"delta": {"content": "Hi"}}]}, usage)
    assert usage == {}
    _usage(
        CHAT,
        {
            "choices": [],
            "usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 64}},
        },
        usage,
    )
    assert usage == {"prompt": 100, "cached": 64}
    assert (
        Reply(1.0, 2.0, "", 100, 64).computed_tokens == 36
        and Reply(1.0, 2.0, "").computed_tokens is None
    )


def test_the_ways_take_turns_request_by_request(monkeypatch):
    """Request i goes to every server (the order rotating) before request i + 1 goes to any;
    each server sees the trace in order; a server limited to some requests skips the others."""
    sent = []

    def fake_stream(host, port, path, body, headers=None):
        sent.append((port, len(body["messages"])))
        return Reply(0.1, 0.2, "x")

    monkeypatch.setattr(agent, "stream", fake_stream)
    trace = build_trace(1)  # 6 requests
    servers = [
        Served(name, "127.0.0.1", port, path, None)
        for name, port, path in (("a", 1, MESSAGES), ("b", 2, CHAT), ("c", 3, CHAT))
    ]
    replies = replay_interleaved(servers, trace, 4, {"b": {0, 3}})
    assert [port for port, _ in sent] == [1, 2, 3, 3, 1, 3, 1, 1, 2, 3, 3, 1, 3, 1]
    for port in (1, 3):  # the trace in order: the history grows
        sizes = [n for p, n in sent if p == port]
        assert len(sizes) == 6 and sizes == sorted(sizes)
    assert [r is not None for r in replies["b"]] == [True, False, False, True, False, False]


def test_bench_agent_json_on_a_tiny_model(tmp_path, capsys):
    model = write_tiny_model(
        tmp_path / "tiny", TinyModelSpec(num_layers=2, max_position_embeddings=32768)
    )
    template = resource_path(SMOLLM2_TOOLS_TEMPLATE)
    argv = [
        "bench",
        "agent",
        "--model",
        str(model),
        "--rounds",
        "2",
        "--max-tokens",
        "4",
        "--json",
        "--chat-template",
        str(template),
        "--data-dir",
        str(tmp_path),
        "--nocache-every",
        "3",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] == 8 and report["replies_identical"] is True
    assert report["nocache_requests"] == [0, 3, 6]
    assert list(report)[-3:] == [
        "ttft_sum_s",
        "ratio_ours_vs_ours_no_cache",
        "ratio_ours_vs_mlx_lm_server",
    ]
    assert set(report["ttft_sum_s"]) == {"ours_cache", "ours_no_cache", "mlx_lm_server"}
    assert all(v > 0 for v in report["ttft_sum_s"].values())
    assert report["ratio_ours_vs_ours_no_cache"] > 0 and report["ratio_ours_vs_mlx_lm_server"] > 0
    assert all(len(run) == 8 for runs in report["ttft_s"].values() for run in runs)
    assert [t is not None for t in report["ttft_s"]["ours_no_cache"][0]] == [
        i in (0, 3, 6) for i in range(8)
    ]
    computed = report["computed_tokens"]
    # every server reports its usage; our cache serves the history (served with --no-cache: none
    # of it)
    assert all(
        n is not None and n > 0 for way in ("ours_cache", "mlx_lm_server") for n in computed[way]
    )
    assert all(computed["ours_cache"][i] < computed["ours_no_cache"][i] for i in (3, 6))
    assert report["computed_tokens_sum"]["ours_cache"] < sum(
        n for n in computed["ours_no_cache"] if n
    )


def test_bench_agent_without_the_no_cache_way(tmp_path, capsys, monkeypatch):
    started = []

    def fake_start(data, model, use_cache, path=MESSAGES, template_file=None):
        started.append(use_cache)
        return Served("ours_cache" if use_cache else "ours_no_cache", "127.0.0.1", 1, path, None)

    monkeypatch.setattr(agent, "save_mlx_folder", lambda *a, **k: None)
    monkeypatch.setattr(agent, "start_ours", fake_start)
    monkeypatch.setattr(
        agent,
        "start_mlx_lm_server",
        lambda folder: Served("mlx_lm_server", "127.0.0.1", 2, CHAT, None),
    )
    monkeypatch.setattr(
        agent,
        "stream",
        lambda host, port, path, body, headers=None: Reply(0.1 * port, 1.0, "same", 10, 4),
    )
    argv = [
        "bench",
        "agent",
        "--rounds",
        "1",
        "--skip-nocache",
        "--endpoint",
        "chat",
        "--data-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert started == [True]
    assert (
        "ours / mlx_lm.server:      0.500" in out
        and "median 0.500" in out
        and "without cache" not in out
    )
