"""What the benchmarks share (bench/harness.py): repetitions, scratch data folders,
the end of a request, an event stream over a raw connection."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.harness import (
    TRAVEL_NOTES,
    chat_stream,
    final_event,
    link_models,
    package_version,
    repetitions,
    scratch_data_folder,
    travel_notes,
)
from core.engine.types import DoneEvent, ErrorEvent, RequestStats, TokenEvent
from core.errors import UserError


def test_repetitions_count_from_zero_and_announce_each(capsys):
    assert list(repetitions("multiturn", 2)) == [0, 1]
    assert capsys.readouterr().err.splitlines() == [
        "radixchat: bench multiturn: repetition 1/2",
        "radixchat: bench multiturn: repetition 2/2",
    ]


def test_a_scratch_folder_shares_the_caches_and_goes_even_when_the_run_fails(tmp_path):
    root = tmp_path / "data"
    (root / "tokenizers").mkdir(parents=True)
    (root / "tokenizers" / "t.json").write_text("{}")
    (root / "file_hashes.json").write_text('{"a": 1}')
    with pytest.raises(RuntimeError), scratch_data_folder(root, "restore") as folder:
        assert folder.parent == root / "tmp" and folder.name.startswith("bench-restore-")
        assert (folder / "tokenizers" / "t.json").read_text() == "{}"  # linked, not rebuilt
        assert (folder / "file_hashes.json").read_text() == '{"a": 1}'
        assert not (folder / "converted").exists()  # root has none
        raise RuntimeError("the run failed")
    assert not folder.exists() and (root / "tokenizers" / "t.json").exists()


def test_link_models_links_each_model_once(tmp_path):
    (tmp_path / "root" / "models" / "m.gguf").parent.mkdir(parents=True)
    (tmp_path / "root" / "models" / "m.gguf").write_bytes(b"GGUF")
    link_models(tmp_path / "root", tmp_path / "fresh")
    link_models(tmp_path / "root", tmp_path / "fresh")  # again: what is there stays
    linked = tmp_path / "fresh" / "models" / "m.gguf"
    assert linked.is_symlink() and linked.read_bytes() == b"GGUF"


def test_travel_notes_grow_evenly():
    assert travel_notes(0) == ""
    lines = travel_notes(len(TRAVEL_NOTES) + 1).splitlines()
    assert lines[0] == lines[-1] == f"- {TRAVEL_NOTES[0]}" and len(lines) == len(TRAVEL_NOTES) + 1


def test_package_version_reads_the_metadata():
    from importlib.metadata import version

    assert package_version("mlx") == version("mlx")
    assert package_version("no-such-package-here") is None


def test_final_event_is_the_done_event_or_a_user_error_naming_the_bench():
    done = DoneEvent("hi", RequestStats())
    assert final_event(iter([TokenEvent("h"), done]), "restore") is done
    with pytest.raises(
        UserError, match=r"^bench pressure: a request failed: the prompt is too long$"
    ):
        final_event(iter([TokenEvent("h"), ErrorEvent("the prompt is too long")]), "pressure")
    with pytest.raises(UserError, match="no reply from the engine"):
        final_event(iter([]), "restore")


class _Server(ThreadingHTTPServer):
    status = 200
    lines: list[bytes] = []


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/chat/completions" and body["stream"] is True
        self.send_response(self.server.status)
        self.end_headers()
        self.wfile.writelines(self.server.lines)

    def log_message(self, *args):
        pass


@pytest.fixture
def sse_server():
    server = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _read(server, bench: str = "serve") -> list[dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
    try:
        return [chunk for _, chunk in chat_stream(conn, json.dumps({"stream": True}), bench)]
    finally:
        conn.close()


def test_chat_stream_yields_the_data_chunks_in_order(sse_server):
    sse_server.lines = [
        b": a comment\n",
        b'data: {"n": 1}\n',
        b"\n",
        b'data: {"n": 2}\n',
        b"data: [DONE]\n",
    ]
    assert _read(sse_server) == [{"n": 1}, {"n": 2}]


def test_chat_stream_names_the_bench_on_an_error_chunk_or_status(sse_server):
    sse_server.lines = [b'data: {"n": 1}\n', b'data: {"error": {"message": "engine gone"}}\n']
    with pytest.raises(UserError, match=r"^bench distributed: the stream failed: engine gone$"):
        _read(sse_server, "distributed")
    sse_server.status, sse_server.lines = 503, [b"busy"]
    with pytest.raises(UserError, match=r"^bench restore --api: the server answered 503: busy$"):
        _read(sse_server, "restore --api")
