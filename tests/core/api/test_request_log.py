"""The API's request log: one entry per finished request, its dialect from its path, the
newest kept."""

from __future__ import annotations

from core.api.request_log import RequestLog, dialect_of
from core.engine.types import RequestStats


def test_dialect_from_the_path():
    assert dialect_of("/v1/messages") == "anthropic"
    assert dialect_of("/v1/messages/count_tokens") == "anthropic"
    assert dialect_of("/v1/chat/completions") == "openai"
    assert dialect_of("/v1/completions") == "openai"


def test_the_log_keeps_the_newest_requests_with_their_figures():
    log = RequestLog(size=2)
    stats = RequestStats(
        prompt_tokens=100,
        cached_tokens=60,
        restored_tokens=30,
        computed_tokens=10,
        completion_tokens=7,
        finish_reason="stop",
    )
    log.record("/v1/chat/completions", stats, 0.25)
    log.record("/v1/messages", stats, 0.5)
    log.record_error("/v1/messages", "the prompt is too long")
    entries = log.recent()
    assert [e.dialect for e in entries] == ["anthropic", "anthropic"]  # the oldest went
    ok, failed = entries
    assert (ok.prompt_tokens, ok.served_tokens, ok.completion_tokens, ok.ttft_s) == (
        100,
        90,
        7,
        0.5,
    )
    assert ok.finish_reason == "stop" and ok.error is None
    assert failed.error == "the prompt is too long" and failed.prompt_tokens == 0
    assert failed.at >= ok.at
