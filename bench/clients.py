"""``radixchat bench clients``: real coding agents (Claude Code, Codex) against a RadixChat
server, unchanged, on a small task in a scratch folder.

It installs nothing: a client runs where ``claude`` / ``codex`` are on PATH (or named by
``--claude`` / ``--codex``). The server is this process's own (an engine and the API on a
free loopback port, in a scratch data folder: its cache starts empty), on ``--model``
(qwen2.5-coder-0.5b by default: an instruct model that calls tools, with a 32k context,
room for the agents' 12k-20k-token first prompts) with the model's own chat template. Each
client runs non-interactively (``claude -p``, ``codex exec``) with a scratch HOME, its
timeouts raised (a CPU prefills such a prompt for minutes), and the server's request log
says, per request: the dialect,
prompt tokens, tokens the cache served, time to first token (from arrival) and how it
ended. The client finished without an API error when it exited 0 and (Claude Code's
JSON result) reported no error.

mlx_lm.server serves neither ``/v1/messages`` (Claude Code) nor ``/v1/responses`` (Codex):
unless ``--no-mlx-lm``, the bench starts it on the same weights and shows what it answers
to each client's endpoint, so the table says why it has no rows.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import link_models, scratch_data_folder
from core import paths
from core.engine.config import EngineConfig
from core.errors import UserError

CLIENTS = ("claude", "codex")
ENDPOINTS = {"claude": "/v1/messages", "codex": "/v1/responses"}
DIALECTS = {"claude": "Anthropic Messages", "codex": "OpenAI Responses"}


# ------------------------------------------------------------------ the clients
def find_client(name: str, given: str | None) -> str | None:
    """The client's executable: ``given`` (a path or a name on PATH), else ``name`` on PATH."""
    if given:
        found = shutil.which(given) or (given if Path(given).is_file() else None)
        if found is None:
            raise UserError(f"--{name}: {given} is not an executable")
        return found
    return shutil.which(name)


def claude_run(path: str, base_url: str, home: Path, task: str, turns: int, max_output: int):
    """Claude Code's command line and environment: ``-p`` (print mode), JSON result, edits
    allowed in its folder, its stream and request timeouts raised to an hour, its replies
    held to ``max_output`` tokens (it asks for 64,000)."""
    argv = [
        path,
        "-p",
        task,
        "--max-turns",
        str(turns),
        "--permission-mode",
        "acceptEdits",
        "--output-format",
        "json",
    ]
    env = {
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "radixchat",
        "API_TIMEOUT_MS": "3600000",
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": "3600000",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output),
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return argv, env


def codex_run(path: str, base_url: str, home: Path, task: str, model: str):
    """Codex's command line and environment: ``exec`` with a provider for the server (the
    Responses API), its config in a scratch CODEX_HOME, writes allowed in its folder."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f"model = {json.dumps(model)}\n"
        'model_provider = "radixchat"\n\n'
        "[model_providers.radixchat]\n"
        'name = "RadixChat"\n'
        f"base_url = {json.dumps(base_url + '/v1')}\n"
        'wire_api = "responses"\n'
        "stream_idle_timeout_ms = 3600000\n"
        "request_max_retries = 0\n"
    )
    argv = [path, "exec", "--skip-git-repo-check", "--sandbox", "workspace-write", task]
    return argv, {"HOME": str(home), "CODEX_HOME": str(codex_home)}


def outcome(name: str, returncode: int, stdout: str, stderr: str) -> str | None:
    """None when the client finished without an API error, else what went wrong (one line)."""
    if name == "claude":
        try:
            result = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            result = None
        if isinstance(result, dict) and result.get("is_error"):
            return str(result.get("result") or "an error")[:200]
    if returncode != 0:
        lines = [line for line in (stderr or stdout).strip().splitlines() if line.strip()]
        # Codex prints its error, then a summary ("tokens used", a count): say the error
        errors = [line for line in lines if line.startswith("ERROR:")]
        last = (errors or lines)[-1][:200] if lines else "no output"
        return f"exit {returncode}: {last}"
    return None


ANSWER_SHOWN = 400  # characters of a client's last reply the report keeps


def final_answer(name: str, stdout: str) -> str:
    """What the client showed as the model's last reply (Claude Code's ``result``, Codex's
    standard output), on one line, cut to ``ANSWER_SHOWN`` characters: where a client made
    no file, this says what the model did instead."""
    text = stdout.strip()
    if name == "claude":
        try:
            result = json.loads(text.splitlines()[-1])
        except (ValueError, IndexError):
            result = None
        text = str(result.get("result") or "") if isinstance(result, dict) else text
    text = " ".join(text.split())
    return text if len(text) <= ANSWER_SHOWN else text[:ANSWER_SHOWN] + "..."


def client_version(path: str) -> str:
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return (done.stdout or done.stderr).strip().splitlines()[0] if done.stdout else "?"


# ------------------------------------------------------------------ mlx_lm.server
def probe_mlx_lm_server(root: Path, model: str) -> dict:
    """Start mlx_lm.server on ``model``'s weights and ask each client's endpoint."""
    from bench.agent import save_mlx_folder
    from bench.server_process import ServerProcess, free_port, mlx_lm_server_code

    answers = {}
    with tempfile.TemporaryDirectory(prefix="bench-clients-mlx-") as folder:
        mlx_folder = Path(folder) / "mlx"
        save_mlx_folder(root, model, mlx_folder)
        port = free_port()
        with ServerProcess("mlx_lm.server", mlx_lm_server_code(mlx_folder, port), port):
            for name, endpoint in ENDPOINTS.items():
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                try:
                    body = json.dumps({"model": "x", "max_tokens": 1, "input": "hi"})
                    conn.request(
                        "POST", endpoint, body, headers={"Content-Type": "application/json"}
                    )
                    answers[name] = conn.getresponse().status
                finally:
                    conn.close()
    return {
        "answers": {ENDPOINTS[n]: status for n, status in answers.items()},
        "serves": [n for n, status in answers.items() if status == 200],
    }


# ------------------------------------------------------------------ the bench
def run_client(name: str, path: str, server, model: str, args) -> dict:
    """Run one client on the task in a scratch folder; its requests from the server's log."""
    base_url = server.address
    with tempfile.TemporaryDirectory(prefix=f"bench-clients-{name}-") as scratch:
        home, work = Path(scratch) / "home", Path(scratch) / "work"
        home.mkdir()
        work.mkdir()
        if name == "claude":
            argv, env = claude_run(
                path, base_url, home, args.task, args.max_turns, args.max_output_tokens
            )
        else:
            argv, env = codex_run(path, base_url, home, args.task, model)
        before = len(server.state.request_log.recent())
        print(
            f"radixchat: bench clients: running {name} (minutes on a CPU)",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                cwd=work,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,  # codex exec reads a prompt from a stdin that is open
                capture_output=True,
                text=True,
                timeout=args.timeout_s,
                check=False,
            )
            error = outcome(name, done.returncode, done.stdout, done.stderr)
            answer = final_answer(name, done.stdout)
        except subprocess.TimeoutExpired:
            error, answer = f"did not finish within {args.timeout_s} s", ""
        seconds = time.monotonic() - started
        made = sorted(p.name for p in work.iterdir())
    requests = [
        {
            "dialect": entry.dialect,
            "path": entry.path,
            "prompt_tokens": entry.prompt_tokens,
            "cached_tokens": entry.served_tokens,
            "completion_tokens": entry.completion_tokens,
            "ttft_s": round(entry.ttft_s, 2),
            "finish_reason": entry.finish_reason,
            "error": entry.error,
        }
        for entry in server.state.request_log.recent()[before:]
    ]
    for previous, request in zip(requests, requests[1:], strict=False):
        if previous["prompt_tokens"]:
            request["cached_of_previous"] = round(
                request["cached_tokens"] / previous["prompt_tokens"], 3
            )
    return {
        "client": name,
        "version": client_version(path),
        "finished": error is None,
        "error": error,
        "seconds": round(seconds, 1),
        "files_made": made,
        "answer": answer,
        "requests": requests,
    }


def run_bench_clients(args) -> int:
    from core.api.limits import RequestLimits
    from core.api.server import ApiServer
    from core.engine.engine import Engine

    found = {name: find_client(name, getattr(args, name)) for name in CLIENTS}
    if not any(found.values()):
        raise UserError(
            "bench clients: neither claude nor codex is on PATH (give them with --claude PATH "
            "or --codex PATH; this bench installs nothing)"
        )
    root = paths.data_dir(args.data_dir)
    report: dict = {
        "model": args.model,
        "task": args.task,
        "max_output_tokens": args.max_output_tokens,
        "clients": [],
        "missing": [],
    }
    with scratch_data_folder(root, "clients") as data:
        link_models(root, data)
        engine = Engine(data, args.model, config=EngineConfig(pool_tokens=args.kv_tokens)).start()
        try:
            info = engine.wait_ready()
            report["model"] = info.name
            report["context_length"] = info.context_length
            limits = RequestLimits(max_output_tokens=args.max_output_tokens)
            with ApiServer(engine, "127.0.0.1", 0, limits=limits) as server:
                for name in CLIENTS:
                    if found[name] is None:
                        report["missing"].append(name)
                        continue
                    report["clients"].append(run_client(name, found[name], server, info.name, args))
        finally:
            engine.shutdown()
    if not args.no_mlx_lm:
        report["mlx_lm_server"] = probe_mlx_lm_server(root, args.model)
    print(json.dumps(report) if args.json else format_clients(report))
    return 0 if all(c["finished"] for c in report["clients"]) else 1


def format_clients(report: dict) -> str:
    """The report as a table: a row per request of each client, then each client's outcome."""
    lines = [
        f"bench clients: {report['model']} (context {report.get('context_length', '?')}), "
        f"task: {report['task']!r}, replies up to {report.get('max_output_tokens', '?')} tokens",
        "",
        f"{'client':<8} {'#':>2} {'dialect':<10} {'prompt':>7} {'cached':>7} "
        f"{'of prev':>7} {'TTFT s':>8} {'out':>5}  end",
    ]
    for client in report["clients"]:
        for i, r in enumerate(client["requests"], 1):
            share = r.get("cached_of_previous")
            lines.append(
                f"{client['client']:<8} {i:>2} {r['dialect']:<10} {r['prompt_tokens']:>7,} "
                f"{r['cached_tokens']:>7,} {(f'{share:.0%}' if share is not None else '-'):>7} "
                f"{r['ttft_s']:>8.1f} {r['completion_tokens']:>5}  "
                f"{r['error'] or r['finish_reason']}"
            )
    lines.append("")
    for client in report["clients"]:
        state = "finished, no API error" if client["finished"] else f"FAILED: {client['error']}"
        lines.append(
            f"{client['client']} ({client['version']}): {state}; {len(client['requests'])} "
            f"requests in {client['seconds']:.0f} s; files made: "
            f"{', '.join(client['files_made']) or 'none'}"
        )
        if client.get("answer"):
            lines.append(f"  its last reply: {client['answer']!r}")
    for name in report["missing"]:
        lines.append(f"{name}: not on PATH (give it with --{name} PATH): not run")
    mlx = report.get("mlx_lm_server")
    if mlx is not None:
        answers = ", ".join(f"{path} -> {status}" for path, status in mlx["answers"].items())
        lines.append(
            f"mlx_lm.server: {answers}: it has neither /v1/messages nor /v1/responses, so "
            "neither Claude Code nor Codex can run against it"
            if not mlx["serves"]
            else f"mlx_lm.server: {answers}"
        )
    return "\n".join(lines)
