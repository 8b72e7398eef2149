"""``radixchat bench tool-loop``: an agent's tool loop through an MCP server (issue 46.3):
each step's prompt tokens, those the cache served (RAM, or disk after a restart) and those
computed.

The loop: a question about a scratch folder of three files, then ``--steps`` steps; at each
the model must call one of the server's tools (``tool_choice`` "required": the loop's length
does not hang on a small model's choice), the call runs through core.mcp's hub, and the
next step's prompt is the last one plus the call and its result
(``core.chats.tool_steps.loop_messages``, as the window sends it); a last request (the model
free to answer) ends it. Run twice, each on a fresh data folder: every step in one engine
(RAM), then with the engine restarted after step ``--restart-after`` (the step after it
finds its prefix on disk). ``--mcp-command`` is the server's command line (``{folder}``: the
scratch folder), by default the npm filesystem server through npx.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
import time
from pathlib import Path

from bench.harness import link_models, scratch_data_folder
from core import paths
from core.chats import tool_steps
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.types import ChatMessage, DoneEvent, ErrorEvent, GenerationRequest, SamplingParams
from core.errors import UserError
from core.mcp.config import McpServer
from core.mcp.hub import McpHub

DEFAULT_COMMAND = "npx -y @modelcontextprotocol/server-filesystem {folder}"
QUESTION = "Look at the folder {folder}: list it, then read its files one by one."
FILES = {"notes.txt": "buy milk\n", "main.py": "print('hi')\n", "data.csv": "a,b\n1,2\n"}
SESSION = "tool-loop"


def _start(data: Path, args) -> Engine:
    engine = Engine(data, args.model, config=EngineConfig(pool_tokens=args.pool_tokens)).start()
    engine.wait_ready()
    return engine


def _ask(engine: Engine, messages, table, required: bool, max_tokens: int) -> DoneEvent:
    request = GenerationRequest(
        messages=tuple(messages),
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
        session=SESSION,
        tools=table.specs,
        tool_choice="required" if required else "auto",
    )
    for event in engine.stream(request):
        if isinstance(event, ErrorEvent):
            raise UserError(f"the model's step failed: {event.message}")
        if isinstance(event, DoneEvent):
            return event
    raise UserError("the engine ended a step without a reply")


def _figures(done: DoneEvent, started: float) -> dict:
    s = done.stats
    return {
        "prompt": s.prompt_tokens,
        "ram": s.cached_tokens,
        "disk": s.restored_tokens,
        "computed": s.computed_tokens,
        "ttft_s": round(s.ttft_s, 3),
        "wall_s": round(time.monotonic() - started, 3),
    }


def run_loop(args, root: Path, folder: Path, restart_after: int | None) -> list[dict]:
    """One loop on a fresh data folder: a row per request (step, call, figures)."""
    words = [w.replace("{folder}", str(folder)) for w in shlex.split(args.mcp_command)]
    hub = McpHub(root, [McpServer("files", command=words[0], args=tuple(words[1:]))])
    hub.start()
    rows: list[dict] = []
    try:
        deadline = time.monotonic() + 120
        while (status := hub.status("files")).state not in ("ready", "failed"):
            if time.monotonic() > deadline:
                raise UserError("the MCP server did not start in 120 s")
            time.sleep(0.1)
        if status.state == "failed":
            raise UserError(f"the MCP server failed: {status.error}")
        chosen = {t.strip() for t in (args.tools or "").split(",") if t.strip()}
        table = hub.tools({"files": chosen or None})
        if not table.specs:
            raise UserError(f"the MCP server offers none of the tools {sorted(chosen)}")
        with scratch_data_folder(root, "tool-loop") as data:
            link_models(root, data)
            engine = _start(data, args)
            try:
                base = [ChatMessage("user", QUESTION.format(folder=folder))]
                steps: list[dict] = []
                for step in range(1, args.steps + 2):
                    last = step == args.steps + 1  # the answer: the model free to write
                    started = time.monotonic()
                    done = _ask(
                        engine,
                        tool_steps.loop_messages(tuple(base), tuple(steps)),
                        table,
                        required=not last,
                        max_tokens=args.answer_tokens if last else 160,
                    )
                    row = {"step": step, **_figures(done, started)}
                    if last or not done.tool_calls:
                        rows.append({**row, "call": None})
                        break
                    steps.append(_run_calls(hub, table, done))
                    row["call"] = steps[-1]["tool_calls"][0]["name"]
                    row["result"] = steps[-1]["results"][0]["status"]
                    rows.append(row)
                    if restart_after == step:
                        engine.flush_disk_cache()
                        engine.shutdown()
                        engine = _start(data, args)  # RAM empty: the disk holds the loop
                        row["restart_after"] = True
            finally:
                engine.shutdown()
    finally:
        hub.stop()
    return rows


def _run_calls(hub: McpHub, table, done: DoneEvent) -> dict:
    calls, results = [], []
    for call in done.tool_calls:
        server, tool = table.route(call.name) or (None, None)
        calls.append(
            {
                "id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "server": server,
                "tool": tool,
            }
        )
        if server is None:
            results.append(
                {
                    "id": call.id,
                    "status": "error",
                    "parts": [{"type": "text", "text": f"no tool named {call.name}"}],
                }
            )
            continue
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            arguments = {}
        result = hub.call(server, tool, arguments if isinstance(arguments, dict) else {}, 60)
        result = result.result(65)
        results.append(
            {
                "id": call.id,
                "status": "error" if result.is_error else "ok",
                "parts": [{"type": "text", "text": result.text}],
            }
        )
    return {"content": done.text, "tool_calls": calls, "results": results}


def run_bench_tool_loop(args) -> int:
    if args.steps < 1 or not 1 <= args.restart_after <= args.steps:
        raise UserError("--steps must be at least 1 and --restart-after between 1 and --steps")
    root = paths.data_dir(args.data_dir)
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="radixchat-tool-loop-") as scratch:
        folder = Path(scratch) / "project"
        folder.mkdir()
        for name, text in FILES.items():
            (folder / name).write_text(text)
        ram = run_loop(args, root, folder, None)
        load.append(os.getloadavg()[0])
        restarted = run_loop(args, root, folder, args.restart_after)
    load.append(os.getloadavg()[0])
    report = {
        "bench": "tool-loop",
        "model": args.model,
        "mcp_command": args.mcp_command,
        "steps": args.steps,
        "restart_after": args.restart_after,
        "ram": ram,
        "restarted": restarted,
        "load": load,
    }
    print(json.dumps(report, indent=2) if args.json else format_tool_loop(report))
    return 0


def format_tool_loop(report: dict) -> str:
    lines = [
        f"bench tool-loop: {report['steps']} tool steps and an answer on {report['model']}",
        f"  server: {report['mcp_command']}",
    ]
    for name, rows in (
        ("one engine (RAM)", report["ram"]),
        (f"restarted after step {report['restart_after']}", report["restarted"]),
    ):
        lines.append(f"  {name}:")
        lines.append("    step  call                     prompt   RAM  disk  computed  TTFT")
        for row in rows:
            call = row.get("call") or "(answer)"
            lines.append(
                f"    {row['step']:>4}  {call[:23]:<23} {row['prompt']:>7} {row['ram']:>5} "
                f"{row['disk']:>5} {row['computed']:>9}  {row['ttft_s']:.2f} s"
                + ("   <- restart after this step" if row.get("restart_after") else "")
            )
    lines.append("  load average (1 min): " + " -> ".join(f"{v:.2f}" for v in report["load"]))
    return "\n".join(lines)
