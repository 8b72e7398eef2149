"""``radixchat bench hostile``: what a flood of connections, a greedy client and a huge body
cost the other clients of a server (issue 26).

Our server runs as a subprocess (``radixchat serve`` with two API keys: A the attacker, B
the other client), on the model asked for. Three scenes, each measured from B's side:

1. **flood**: ``--connections`` connections (2,100) that each send half a request head and
   hold (one that the server closes is opened again at once, for the whole scene); B's
   ``GET /health`` and a 4-token chat, ``--probes`` times, a second apart;
2. **greedy**: ``--streams`` (16) streaming chats on key A of ``--long-tokens`` tokens whose
   client never reads; once they decode, B's streamed 4-token chat: its first token and
   its end;
3. **tools**: key A sends bodies of ``--tools`` (30,000) tools, one after another, for the
   whole scene; B's 4-token chat meanwhile.

Reported: per scene, B's worst (and median) time to answer, against the target of 2 s; and
first, as the reference, B's answers with nobody attacking (**quiet**).
"""

from __future__ import annotations

import http.client
import json
import platform
import resource
import socket
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.server_process import ServerProcess, free_port, radixchat_server_code
from core import paths
from core.errors import UserError

TARGET_S = 2.0
KEY_A, KEY_B = "bench-attacker-key", "bench-other-key"
HALF_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}


@dataclass
class Scene:
    name: str
    what: str
    probes: list[float] = field(default_factory=list)  # seconds to B's answers (or first token)
    ends: list[float] = field(default_factory=list)  # greedy: seconds to B's whole 4-token reply
    failures: list[str] = field(default_factory=list)
    attacker: dict = field(default_factory=dict)  # what the attacker did meanwhile

    @property
    def worst_s(self) -> float | None:
        return max(self.probes + self.ends) if self.probes and not self.failures else None

    @property
    def meets(self) -> bool:
        return self.worst_s is not None and self.worst_s <= TARGET_S


def _request(
    port: int,
    method: str,
    path: str,
    body: dict | bytes | None = None,
    key: str = KEY_B,
    timeout: float = 60.0,
) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {key}"}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, data, headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _timed(scene: Scene, call, *args, **kwargs) -> None:
    began = time.perf_counter()
    try:
        status = call(*args, **kwargs)
    except OSError as exc:
        scene.failures.append(f"{type(exc).__name__}: {exc}")
        return
    if status != 200:
        scene.failures.append(f"status {status}")
    scene.probes.append(time.perf_counter() - began)


def _first_token_and_end(port: int) -> tuple[float, float]:
    """B's streamed 4-token chat: seconds to its first content chunk, and to its end."""
    began = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps({**CHAT, "stream": True}).encode(),
            {"Authorization": f"Bearer {KEY_B}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        if response.status != 200:
            raise OSError(f"status {response.status}")
        first = None
        for line in response:
            if (
                first is None
                and line.startswith(b"data: {")
                and b'"content":"' in line.replace(b" ", b"")
            ):
                if b'"content":""' not in line.replace(b" ", b""):
                    first = time.perf_counter() - began
            if line.startswith(b"data: [DONE]"):
                break
        end = time.perf_counter() - began
        return (first if first is not None else end), end
    finally:
        conn.close()


class _Holder:
    """Keeps ``count`` half-sent request heads open until stopped, opening again the ones
    the server closes."""

    def __init__(self, port: int, count: int):
        self.port, self.count = port, count
        self.opened = self.closed_by_server = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-flood", daemon=True)

    def __enter__(self) -> _Holder:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)

    def _open(self) -> socket.socket | None:
        sock = socket.socket()
        sock.settimeout(2)
        try:
            sock.connect(("127.0.0.1", self.port))
            sock.sendall(HALF_HEAD)
        except OSError:
            sock.close()
            return None
        sock.setblocking(False)
        self.opened += 1
        return sock

    def _run(self) -> None:
        held: list[socket.socket] = []
        try:
            while not self._stop.is_set():
                alive = []
                for sock in held:
                    try:
                        sock.recv(1024)  # the end, or a refusal: the server let it go
                        gone = True
                    except BlockingIOError:
                        gone = False
                    except OSError:
                        gone = True
                    if gone:
                        self.closed_by_server += 1
                        sock.close()
                    else:
                        alive.append(sock)
                held = alive
                while len(held) < self.count and not self._stop.is_set():
                    sock = self._open()
                    if sock is None:
                        break
                    held.append(sock)
                self._stop.wait(0.2)
        finally:
            for sock in held:
                sock.close()


def quiet(port: int, probes: int) -> Scene:
    scene = Scene("quiet", "nobody else: the reference")
    for _ in range(probes):
        _timed(scene, _request, port, "GET", "/health")
        _timed(scene, _request, port, "POST", "/v1/chat/completions", CHAT)
    return scene


def flood(port: int, connections: int, probes: int) -> Scene:
    scene = Scene("flood", f"{connections:,} connections holding half a request head")
    with _Holder(port, connections) as holder:
        while holder.opened < connections:
            time.sleep(0.05)
        for _ in range(probes):
            _timed(scene, _request, port, "GET", "/health")
            _timed(scene, _request, port, "POST", "/v1/chat/completions", CHAT)
            time.sleep(1.0)
        scene.attacker = {
            "connections_opened": holder.opened,
            "closed_by_server": holder.closed_by_server,
        }
    return scene


def greedy(port: int, streams: int, long_tokens: int, probes: int) -> Scene:
    scene = Scene(
        "greedy", f"{streams} streams of {long_tokens} tokens on key A whose client never reads"
    )
    count = "\n".join(str(n) for n in range(1, 21))
    requests = []
    # a count to continue (raw text: a chat reply may end after a few lines)
    for i in range(streams):
        body = json.dumps(
            {
                "prompt": f"({i}) Numbers, one per line:\n{count}\n",
                "max_tokens": long_tokens,
                "temperature": 0,
                "stream": True,
            }
        ).encode()
        requests.append(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (KEY_A.encode(), len(body), body)
        )
    silent = []
    try:
        for request in requests:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(request)
            silent.append(sock)
        for sock in silent:  # each is decoding once its first token came; from here on nobody reads
            sock.settimeout(300)
            received = b""
            while received.count(b"data: ") < 2:
                chunk = sock.recv(1024)
                if not chunk:
                    raise UserError("a stream of key A ended before it decoded")
                received += chunk
        in_flight = []
        for _ in range(probes):
            in_flight.append(_in_flight(port))
            try:
                first, end = _first_token_and_end(port)
            except OSError as exc:
                scene.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            scene.probes.append(first)
            scene.ends.append(end)
            time.sleep(1.0)
        scene.attacker = {
            "streams_running_at_each_probe": in_flight,
            "streams_cut_off": sum(b"stopped reading" in _rest(sock) for sock in silent),
        }
    finally:
        for sock in silent:
            sock.close()
    return scene


def _in_flight(port: int) -> int:
    """The API requests the server is serving now (its /metrics)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEY_B}"})
        for line in conn.getresponse().read().decode().splitlines():
            if line.startswith("radixchat_requests_in_flight "):
                return int(float(line.split()[1]))
        return -1
    finally:
        conn.close()


def _rest(sock: socket.socket, seconds: float = 1.0) -> bytes:
    """What a silent stream's socket holds by now, read for at most ``seconds`` (reading lets
    the stream go on, so not to its end)."""
    deadline = time.monotonic() + seconds
    received = b""
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    except OSError:
        pass
    return received


def tools(port: int, count: int, probes: int) -> Scene:
    scene = Scene("tools", f"bodies of {count:,} tools from key A, one after another")
    tool_list = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "a tool",
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
            },
        }
        for i in range(count)
    ]
    heavy = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "tools": tool_list}
    ).encode()
    stop = threading.Event()
    sent: list[tuple[int, float]] = []

    def attack() -> None:
        while not stop.is_set():
            began = time.perf_counter()
            try:
                status = _request(
                    port, "POST", "/v1/chat/completions", heavy, key=KEY_A, timeout=600
                )
            except OSError:
                status = 0
            sent.append((status, time.perf_counter() - began))

    thread = threading.Thread(target=attack, name="bench-tools", daemon=True)
    thread.start()
    try:
        time.sleep(0.5)  # the first body is in flight
        for _ in range(probes):
            _timed(scene, _request, port, "POST", "/v1/chat/completions", CHAT)
            time.sleep(1.0)
    finally:
        stop.set()
        thread.join(600)
    scene.attacker = {
        "bodies_answered": len(sent),
        "body_bytes": len(heavy),
        "statuses": sorted({status for status, _ in sent}),
        "slowest_answer_s": max((s for _, s in sent), default=None),
    }
    return scene


def run_bench_hostile(args) -> int:
    root = paths.data_dir(args.data_dir)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.connections + 256
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            raise UserError(
                f"this process may open {hard} files; --connections {args.connections} needs more"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    port = free_port()
    code = radixchat_server_code(
        args.model, root, port, args.kv_tokens, extra=["--api-key", KEY_A, "--api-key", KEY_B]
    )
    scenes: list[Scene] = []
    with ServerProcess("radixchat serve", code, port, ready_path="/health") as server:
        _request(port, "POST", "/v1/chat/completions", CHAT)  # warm up
        wanted_scenes = args.scenes or ["quiet", "flood", "greedy", "tools"]
        for name in wanted_scenes:
            if name == "quiet":
                scenes.append(quiet(server.port, args.probes))
            elif name == "flood":
                scenes.append(flood(server.port, args.connections, args.probes))
            elif name == "greedy":
                scenes.append(greedy(server.port, args.streams, args.long_tokens, args.probes))
            else:
                scenes.append(tools(server.port, args.tools, args.probes))
    report = {
        "model": args.model,
        "machine": platform.platform(),
        "target_s": TARGET_S,
        "scenes": [
            {
                **asdict(scene),
                "worst_s": scene.worst_s,
                "meets": scene.meets,
                "median_s": statistics.median(scene.probes) if scene.probes else None,
            }
            for scene in scenes
        ],
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)
    return 0


def _print_table(report: dict) -> None:
    out = sys.stdout
    print(
        f"What one client can do to another, on {Path(report['model']).name} (target: "
        f"every answer within {report['target_s']:g} s)",
        file=out,
    )
    for scene in report["scenes"]:
        worst = "failed" if scene["worst_s"] is None else f"{scene['worst_s']:.2f} s"
        median = "-" if scene["median_s"] is None else f"{scene['median_s']:.2f} s"
        print(f"  {scene['name']:7} {scene['what']}", file=out)
        if scene["ends"] and scene["probes"]:
            line = (
                f"          the other client's first token: worst {max(scene['probes']):.2f} s, "
                f"median {median}; its whole reply: worst {max(scene['ends']):.2f} s"
            )
        else:
            line = f"          the other client's answer: worst {worst}, median {median}"
        print(
            line + ("  (meets the target)" if scene["meets"] else "  (MISSES the target)"), file=out
        )
        for failure in scene["failures"][:3]:
            print(f"          failed: {failure}", file=out)
        if scene["attacker"]:
            print(
                "          the attacker: "
                + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in scene["attacker"].items()),
                file=out,
            )
