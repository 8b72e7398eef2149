"""MCP (Model Context Protocol) tool servers: their configuration (``config``), the hub that
holds a session to each (``hub``), the stdio transport (``child``) and the plain values
they hand other threads (``tools``). Nothing here imports PySide6."""
