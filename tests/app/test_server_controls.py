"""Serve API from the app: its settings (port, Ollama's port, API keys, allowed origins, the
network) reach the server, bad ones are refused in one line, and the request log shows the
last requests with their dialect, tokens, cached tokens and time to first token (real
openai, anthropic and ollama clients against the tiny model)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import socket  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402

import anthropic  # noqa: E402
import openai  # noqa: E402
import pytest  # noqa: E402

from app.server_controls import LOG_COLUMNS  # noqa: E402
from tests.app.window_fakes import WAIT_MS, FakeEngine, wait_ready  # noqa: E402


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _status(url: str, headers: dict | None = None, method: str = "GET") -> tuple[int, dict]:
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_api_settings_choose_the_port_keys_and_origins(qtbot, open_window, tmp_path):
    window, bridge, _ = open_window(engine=FakeEngine(tmp_path), server_port=None)
    wait_ready(qtbot, bridge)
    assert window.server.port == 8000  # the default, before any setting
    port = _free_port()
    window.server.settings_action.trigger()
    dialog = window.server.settings_dialog
    dialog.port.setValue(port)
    dialog.keys.setPlainText("sk-first")
    dialog.add_key()
    keys = dialog.keys.toPlainText().splitlines()
    assert keys[0] == "sk-first" and len(keys) == 2 and len(keys[1]) > 20
    dialog.origins.setPlainText("HTTP://LocalHost:3000/")
    with qtbot.waitSignal(dialog.accepted):
        dialog.accept()
    assert window.settings.api_keys == keys
    assert window.settings.api_origins == ["http://localhost:3000"]

    window.serve_action.trigger()
    address = bridge.server_address
    assert address == f"http://127.0.0.1:{port}"
    assert window.server_label.text() == f"API: {address} · key needed"
    assert _status(address + "/v1/models")[0] == 401
    assert _status(address + "/v1/models", {"Authorization": "Bearer sk-first"})[0] == 200
    assert _status(address + "/v1/models", {"x-api-key": keys[1]})[0] == 200
    status, headers = _status(
        address + "/v1/chat/completions",
        {
            "Origin": "http://localhost:3000",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
        method="OPTIONS",
    )
    assert status == 200
    assert headers.get("access-control-allow-origin") == "http://localhost:3000"
    status, _ = _status(
        address + "/v1/models",
        {"Origin": "http://evil.example", "Authorization": "Bearer sk-first"},
    )
    assert status == 403
    with qtbot.waitSignal(bridge.serverStopped, timeout=WAIT_MS):
        window.serve_action.trigger()


@pytest.mark.parametrize(
    ("origins", "network", "keys", "said"),
    [
        ("localhost:3000", False, "", "Allowed origins: an origin is scheme://host[:port]"),
        ("", True, "", "Serving other machines needs an API key"),
    ],
)
def test_bad_api_settings_are_refused_in_one_line(
    qtbot, open_window, tmp_path, origins, network, keys, said
):
    window, bridge, _ = open_window(engine=FakeEngine(tmp_path))
    window.server.settings_action.trigger()
    dialog = window.server.settings_dialog
    dialog.origins.setPlainText(origins)
    dialog.on_network.setChecked(network)
    dialog.keys.setPlainText(keys)
    dialog.accept()
    assert dialog.isVisible() and dialog.error_label.text().startswith(said)
    assert "\n" not in dialog.error_label.text()
    assert window.settings.api_origins == [] and not window.settings.api_on_network
    dialog.reject()


def test_the_request_log_shows_each_request(qtbot, open_window, tiny_model):
    window, bridge, _ = open_window(spec=str(tiny_model))
    name = wait_ready(qtbot, bridge)
    window.serve_action.trigger()
    address = bridge.server_address
    window.server.log_action.trigger()
    log = window.server.log_dialog
    assert log.isVisible() and log.empty.isVisible() and log.tree.topLevelItemCount() == 0

    system = "You are a helpful assistant who answers in a few words. " * 6
    with (  # closed at once: a socket left to the garbage collector warns in a later test
        openai.OpenAI(base_url=address + "/v1", api_key="unused", max_retries=0) as client,
        anthropic.Anthropic(base_url=address, api_key="unused", max_retries=0) as claude,
    ):
        for _ in range(2):  # the second one finds its prompt in the cache
            client.chat.completions.create(
                model=name,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
                max_tokens=4,
                temperature=0,
            )
        claude.messages.create(
            model=name, max_tokens=3, messages=[{"role": "user", "content": "hello"}]
        )
    with qtbot.waitSignal(bridge.statsUpdated, timeout=WAIT_MS):
        bridge.poll_stats()  # the log refreshes with the panels
    rows = [
        [log.tree.topLevelItem(r).text(c) for c in range(len(LOG_COLUMNS))]
        for r in range(log.tree.topLevelItemCount())
    ]
    assert [row[1] for row in rows] == ["Anthropic", "OpenAI", "OpenAI"]  # newest first
    entries = bridge.recent_requests()
    assert len(entries) == 3 and not log.empty.isVisible()
    anthropic_row, second, first = rows
    assert int(first[3].replace(",", "")) == 0 and int(second[3].replace(",", "")) > 0
    assert second[2] == first[2] and int(second[2].replace(",", "")) > 0  # the same prompt
    assert first[4] == "4" and anthropic_row[4] == "3"
    assert all(row[5].endswith(" s") and row[6] == "length" for row in rows)
    # issue 45.7: a refused request shows too (it never reached the engine)
    with openai.OpenAI(base_url=address + "/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=name, messages=[], max_tokens=4)
    with qtbot.waitSignal(bridge.statsUpdated, timeout=WAIT_MS):
        bridge.poll_stats()
    refused = [log.tree.topLevelItem(0).text(c) for c in range(len(LOG_COLUMNS))]
    assert refused[1] == "OpenAI" and refused[6].startswith("refused 400: ")
    assert bridge.recent_requests()[-1].status == 400
    with qtbot.waitSignal(bridge.serverStopped, timeout=WAIT_MS):
        window.serve_action.trigger()


def test_ollamas_port_is_a_setting_and_the_log_names_the_dialect(qtbot, open_window, tiny_model):
    import ollama

    window, bridge, _ = open_window(spec=str(tiny_model), server_port=None)
    wait_ready(qtbot, bridge)
    api_port, ollama_port = _free_port(), _free_port()
    window.server.settings_action.trigger()
    dialog = window.server.settings_dialog
    assert not dialog.ollama.isChecked() and not dialog.ollama_port.isEnabled()  # off at first
    dialog.port.setValue(api_port)
    dialog.ollama.setChecked(True)
    dialog.ollama_port.setValue(api_port)
    dialog.accept()  # the same port twice: refused in one line
    assert dialog.isVisible() and dialog.error_label.text().startswith("Ollama's port must")
    dialog.ollama_port.setValue(ollama_port)
    with qtbot.waitSignal(dialog.accepted):
        dialog.accept()
    assert window.settings.api_ollama_port == ollama_port

    window.serve_action.trigger()
    assert bridge.server_ollama_address == f"http://127.0.0.1:{ollama_port}"
    assert f"Ollama: http://127.0.0.1:{ollama_port}" in window.server_label.text()
    with ollama.Client(host=bridge.server_ollama_address) as client:
        reply = client.chat(
            model="x", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2}
        )
    assert reply.done and _status(bridge.server_ollama_address + "/")[0] == 200
    window.server.log_action.trigger()
    with qtbot.waitSignal(bridge.statsUpdated, timeout=WAIT_MS):
        bridge.poll_stats()
    log = window.server.log_dialog
    assert log.tree.topLevelItem(0).text(1) == "Ollama"
    assert log.tree.topLevelItem(0).toolTip(1) == "/api/chat"
    with qtbot.waitSignal(bridge.serverStopped, timeout=WAIT_MS):
        window.serve_action.trigger()

    window.server.settings_action.trigger()  # switched off again
    dialog = window.server.settings_dialog
    assert dialog.ollama.isChecked() and dialog.ollama_port.value() == ollama_port
    dialog.ollama.setChecked(False)
    with qtbot.waitSignal(dialog.accepted):
        dialog.accept()
    assert window.settings.api_ollama_port is None
