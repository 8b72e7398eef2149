"""The MCP tests' fixtures (tests/core/mcp/mcp_fixtures.py)."""

from tests.core.mcp.mcp_fixtures import memory_keyring, no_keyring  # noqa: F401
