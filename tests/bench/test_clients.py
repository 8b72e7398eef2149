"""``radixchat bench clients`` with a stand-in for Claude Code (a script that talks to
``ANTHROPIC_BASE_URL`` as ``claude -p`` does: two requests sharing their prompt, tools
included) on a tiny model whose template takes no tools: each request's row, the second
one's prompt read from the cache, and a client reported missing where it is not on PATH."""

from __future__ import annotations

import json
import sys

from bench.clients import ANSWER_SHOWN, final_answer, format_clients, outcome
from core.cli.main import main

FAKE_CLAUDE = """#!{python}
import json, os, sys, urllib.request
if sys.argv[1:] == ["--version"]:
    print("0.0.1 (stand-in)")
    sys.exit(0)
tool = {{"name": "Write", "input_schema": {{"type": "object",
        "propertyNames": {{"pattern": "^[a-z]+$"}},
        "properties": {{"path": {{"type": "string"}}}}}}}}
messages = [{{"role": "user", "content": "please " * 200 + "write hello.txt"}}]

def ask(messages):
    # as Claude Code does, its replies' ceiling from CLAUDE_CODE_MAX_OUTPUT_TOKENS
    limit = int(os.environ["CLAUDE_CODE_MAX_OUTPUT_TOKENS"])
    body = json.dumps({{"model": "claude-opus-4-8", "max_tokens": limit, "messages": messages,
                        "tools": [tool], "system": [{{"type": "text",
                        "text": "x-anthropic-billing-header: cc_version=" + str(len(messages))}},
                        {{"type": "text", "text": "You are an agent."}}],
                        "temperature": 0}}).encode()
    request = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", body,
                                     {{"Content-Type": "application/json", "x-api-key": "k"}})
    return json.load(urllib.request.urlopen(request, timeout=300))

first = ask(messages)
said = first["content"] or [{{"type": "text", "text": "ok"}}]
messages += [{{"role": "assistant", "content": said}}, {{"role": "user", "content": "and now?"}}]
if any(b["type"] == "tool_use" for b in first["content"]):
    use = next(b for b in first["content"] if b["type"] == "tool_use")
    result = {{"type": "tool_result", "tool_use_id": use["id"], "content": "done"}}
    messages[-1]["content"] = [result]
ask(messages)
print(json.dumps({{"type": "result", "is_error": False, "result": "done"}}))
"""


def test_bench_clients_runs_a_client_and_reads_its_requests(
    capsys, tmp_path, long_tiny_model, monkeypatch
):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    claude = bin_dir / "claude"
    claude.write_text(FAKE_CLAUDE.format(python=sys.executable))
    claude.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))  # no codex here: reported missing, not run
    argv = ["bench", "clients", "--model", str(long_tiny_model), "--no-mlx-lm", "--json"]
    argv += ["--max-output-tokens", "16"]
    assert main([*argv, "--kv-tokens", "8192", "--data-dir", str(tmp_path / "d")]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["missing"] == ["codex"] and report["max_output_tokens"] == 16
    (client,) = report["clients"]
    assert client["client"] == "claude" and client["finished"] and client["error"] is None
    assert client["version"] == "0.0.1 (stand-in)"
    first, second = client["requests"]
    assert first["dialect"] == second["dialect"] == "anthropic"
    assert first["prompt_tokens"] > 200 and first["ttft_s"] > 0
    assert 0 < first["completion_tokens"] <= 16
    # the billing block differs between the two; dropped, the second reads the first's prompt
    assert second["cached_tokens"] >= first["prompt_tokens"] * 0.9
    assert second["cached_of_previous"] >= 0.9
    table = format_clients(report)
    assert "claude (0.0.1 (stand-in)): finished, no API error" in table
    assert "codex: not on PATH" in table
    assert client["answer"] == "done" and "its last reply: 'done'" in table


def test_an_api_error_is_what_the_client_reports():
    result = json.dumps({"type": "result", "is_error": True, "result": "API Error: 400 x"})
    assert outcome("claude", 0, result, "") == "API Error: 400 x"
    assert outcome("claude", 0, json.dumps({"is_error": False}), "") is None
    assert outcome("codex", 1, "", "ERROR: unexpected status 404\n") == (
        "exit 1: ERROR: unexpected status 404"
    )
    stderr = (
        "codex\n[ some text\nERROR: Incomplete response returned, reason: max_output_tokens\n"
        "tokens used\n8,664\n"
    )
    assert outcome("codex", 1, "", stderr) == (
        "exit 1: ERROR: Incomplete response returned, reason: max_output_tokens"
    )
    assert outcome("codex", 0, "done", "") is None


def test_the_clients_last_reply_is_kept_on_one_line_and_cut():
    said = json.dumps({"type": "result", "is_error": False, "result": "I cannot\n write files."})
    assert final_answer("claude", "progress\n" + said) == "I cannot write files."
    shown = final_answer("codex", "\nSure:\n\n  echo hi > hello.txt\n")
    assert shown == "Sure: echo hi > hello.txt"
    long = final_answer("codex", "x" * (ANSWER_SHOWN + 50))
    assert long == "x" * ANSWER_SHOWN + "..."
    assert final_answer("claude", "not json") == "not json"
