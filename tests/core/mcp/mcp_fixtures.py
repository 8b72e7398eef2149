"""What the MCP tests share: an in-memory keychain (and none), the test server, a wait."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import keyring
import keyring.backend
import pytest
from keyring.errors import PasswordDeleteError

from core.mcp.config import McpServer

SERVERS = Path(__file__).parent / "servers"
TOOLS_SERVER = SERVERS / "tools_server.py"


class MemoryKeyring(keyring.backend.KeyringBackend):
    """A keychain in a dict."""

    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.items.get((service, username))

    def set_password(self, service, username, password):
        self.items[(service, username)] = password

    def delete_password(self, service, username):
        if self.items.pop((service, username), None) is None:
            raise PasswordDeleteError(username)


@pytest.fixture
def memory_keyring():
    previous = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(previous)


@pytest.fixture
def no_keyring():
    """The failing backend a headless Linux gets."""
    from keyring.backends import fail

    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(previous)


def tools_server(name: str = "t", **changes) -> McpServer:
    """The test server over stdio."""
    return McpServer(name, command=sys.executable, args=(str(TOOLS_SERVER),), **changes)


def wait_for(hub, name: str, states=("ready", "failed"), timeout: float = 20.0):
    """The server's status once it is in one of ``states``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = hub.status(name)
        if status is not None and status.state in states:
            return status
        time.sleep(0.02)
    raise AssertionError(f"{name} stayed {hub.status(name)}")
