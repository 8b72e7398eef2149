"""The npm ``ollama`` client (tests/core/api/node/ollama_client.mjs) against a live server on
a tiny model: version, list, show, ps, chat whole and streamed, a forced tool call, a JSON
schema, generate with ``context``, embed, an Ollama-shaped refusal, pull (from the loopback
hub) and delete. Skipped where node is missing, or the package is not installed
(``npm install --prefix tests/core/api/node``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from core.api.server import ApiServer
from tests.core.engine.helpers import start_tools_engine
from tests.core.models.hub.hub_fixture import ONE_GGUF

NODE = Path(__file__).parent / "node"
SCRIPT = NODE / "ollama_client.mjs"

pytestmark = [
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
    pytest.mark.skipif(
        not (NODE / "node_modules" / "ollama").is_dir(),
        reason="the npm ollama package is not installed (npm install --prefix tests/core/api/node)",
    ),
]


def test_the_npm_ollama_client(long_tiny_model, tmp_path, loopback_hub):
    engine = start_tools_engine(tmp_path / "data", long_tiny_model)
    pull = f"hf.co/{ONE_GGUF}:Q4_K_M"
    try:
        with ApiServer(engine, "127.0.0.1", 0, ollama_port=0) as server:
            run = subprocess.run(
                ["node", str(SCRIPT), server.ollama_address, pull],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
    finally:
        engine.shutdown()
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout)
    assert got["models"][0] == "tiny-4k:latest" and got["running"] == ["tiny-4k:latest"]
    assert got["capabilities"] == ["completion", "tools"] and got["contextLength"] == 4096
    assert got["chat"]["done"] and got["chat"]["evalCount"] == 8
    assert got["streamed"]["content"] == got["chat"]["content"] and got["streamedDone"] == "length"
    assert [call["name"] for call in got["toolCalls"]] == ["get_time"]
    assert got["toolCalls"][0]["arguments"]["zone"] in ("UTC", "CET")
    assert isinstance(got["json"]["ok"], bool)
    assert got["context"]["extends"] and got["context"]["next"] > got["context"]["first"]
    assert got["embed"] == [1.0, 1.0]  # two unit vectors
    assert got["thinkError"]["status"] == 400
    assert "does not support thinking" in got["thinkError"]["message"]
    assert got["pulled"] == {"first": "pulling manifest", "last": "success", "listed": True}
    assert got["deleted"]
