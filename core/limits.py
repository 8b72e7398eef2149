"""The API server's default limits on what clients may bring, and the engine's setting
choices the command line offers: plain values only, light to import (the command line's
help names them; building its parsers imports no engine and no part of the API).
What they bound and why: :mod:`core.api.limits`, :mod:`core.api.connections`."""

# tools in one request; OpenAI's own limit is 128 functions, agents with many MCP servers send more
MAX_TOOLS = 256
# JSON of one request's tools and response schema (jsonschema: ~10 µs a byte)
MAX_SCHEMA_BYTES = 512 * 1024
# reply tokens of a request that sets no limit of its own (OpenAI's chat and completions,
# the Responses API; Anthropic's max_tokens is required): a model that never ends its turn
# (a base model) stops here instead of decoding to the end of the context. 0: no ceiling.
MAX_OUTPUT_TOKENS = 4096
# prompts one client (an API key; the API without keys is one client) may have waiting for
# prefill at once (core.engine.turns); one more is a 429. 16 streams sent at once fit twice over
MAX_WAITING_PER_KEY = 32
MAX_CONNECTIONS = 1000  # connections held at once, kept below the process's file-descriptor limit

# speculative decoding: --speculative, radixchat.speculative (core.engine.drafts)
SPECULATIVE_MODES = ("off", "ngram", "draft")
