"""A group watched from a front end other than the command line: the hostfile checked
against a model before anything starts, and a child's lines turned into events."""

from __future__ import annotations

import json
import sys
import threading

from core.distributed.group_server import GroupServer, check_group
from core.distributed.outcome import ENDED_PREFIX, fault_line
from core.models.tiny_model import TinyModelSpec, write_tiny_model


def test_check_group_names_the_hosts_and_the_split(tmp_path):
    model = write_tiny_model(tmp_path / "tiny", TinyModelSpec(num_layers=1))
    hosts = tmp_path / "hosts.json"
    hosts.write_text(
        json.dumps(
            {
                "hosts": [
                    {"ssh": "studio.local", "ips": ["192.168.2.1"]},
                    {"ssh": "macbook.local", "ips": ["192.168.2.2", "10.0.0.2"]},
                ]
            }
        )
    )
    check = check_group(str(hosts), str(model))
    assert check.hosts == ("studio.local (192.168.2.1)", "macbook.local (192.168.2.2, 10.0.0.2)")
    assert check.splits and check.summary == "tiny splits over 2 hosts: 1 of its 2 KV heads on each"
    three = tmp_path / "three.json"
    three.write_text(json.dumps([{"ssh": f"h{i}", "ips": [f"10.0.0.{i}"]} for i in range(3)]))
    check = check_group(str(three), str(model))
    assert len(check.hosts) == 3 and not check.splits and "do not divide by 3" in check.summary
    check = check_group(str(tmp_path / "missing.json"), str(model))
    assert not check.splits and check.hosts == () and check.summary.startswith("no hostfile at")
    # a model with no split by heads but a pipeline: its layers are shared out
    pipelined = write_tiny_model(
        tmp_path / "tiny-next", TinyModelSpec(kind="recurrent", num_layers=4)
    )
    check = check_group(str(hosts), str(pipelined))
    assert (
        check.splits
        and check.summary == "tiny-next splits over 2 hosts: pipelined: 2 of 4 layers each"
    )


def run(script: str, stop: bool = False) -> list[tuple[str, str]]:
    events: list[tuple[str, str]] = []
    ended = threading.Event()

    def on_event(kind: str, text: str) -> None:
        events.append((kind, text))
        if kind == "serving" and stop:
            server.stop()
        if kind == "ended":
            ended.set()

    server = GroupServer("hosts.json", "model", 8000, "data", on_event)
    server.command = [sys.executable, "-c", script]
    server.start()
    assert ended.wait(60) and server.wait(10)
    return [e for e in events if e[0] != "line"]


def test_a_clean_stop_and_a_fault_become_events():
    serving = "radixchat: serving m split over 2 hosts at http://127.0.0.1:8000/v1 (Ctrl-C to stop)"
    clean = f"import signal; print({serving!r}, flush=True); signal.sigwait([signal.SIGINT])"
    assert run(
        "import signal; signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT]); " + clean,
        stop=True,
    ) == [("serving", "http://127.0.0.1:8000/v1"), ("ended", "")]
    fault = "rank 1 (macbook.local) left the group (connection closed)"
    script = (
        f"import sys; print({serving!r}); "
        "print('\\x1b[33m[WARN] Node with rank 1 exited with code -9 \\x1b[0m');"
        f"print({fault_line(fault)!r}); print({ENDED_PREFIX + fault!r}); sys.exit(3)"
    )
    assert run(script) == [
        ("serving", "http://127.0.0.1:8000/v1"),
        ("fault", fault),
        ("ended", fault),
    ]
    assert run("import sys; print('radixchat: error: no model at /m'); sys.exit(2)") == [
        ("ended", "no model at /m")
    ]
