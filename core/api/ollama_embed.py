"""Ollama's embeddings: ``/api/embed`` (texts in, unit vectors out, Ollama's figures) and the
older ``/api/embeddings`` (one prompt, one vector), over the engine's embeddings
(:mod:`core.engine.embedding`, as ``/v1/embeddings``).

``/api/embed`` takes ``input`` (a text or texts), ``truncate`` (true by default, as
Ollama's: an input past the context is cut to fit; false: a 400), ``dimensions`` (the
first so many components, scaled to length 1 again), ``options`` and ``keep_alive``
(accepted). Its answer names the model as asked and carries ``embeddings``,
``total_duration``, ``load_duration`` (nanoseconds) and ``prompt_eval_count``, with the
cache's share in ``radixchat``. Both endpoints give unit-length vectors (Ollama's older
endpoint gives them as the model makes them). No HTTP and no engine here.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field, field_validator

from core.api.embedding_schema import MAX_INPUTS
from core.api.ollama_reply import NS
from core.api.ollama_schema import Duration, OllamaOptions
from core.api.wire import CACHE_SALT_TEXT, MAX_SALT_CHARS, Text, WireModel
from core.engine.namespaces import with_salt
from core.engine.types import EmbeddingRequest, EmbeddingResult


class _Embedding(WireModel):
    model: Text | None = None
    options: OllamaOptions | None = Field(None, description="accepted: nothing to sample")
    keep_alive: Duration | None = Field(None, description="accepted")
    cache_salt: Text | None = Field(
        None, min_length=1, max_length=MAX_SALT_CHARS, description="RadixChat: " + CACHE_SALT_TEXT
    )


class OllamaEmbedRequest(_Embedding):
    """``POST /api/embed``."""

    input: Text | list[Text] = Field(description="a text or texts; empty: load only")
    truncate: bool | None = Field(None, description="cut an input past the context (default)")
    dimensions: int | None = Field(None, ge=1, description="keep the first so many components")

    @field_validator("input")
    @classmethod
    def _few_inputs(cls, value):
        if isinstance(value, list) and len(value) > MAX_INPUTS:
            raise ValueError(f"{len(value):,} inputs; at most {MAX_INPUTS:,} in one request")
        return value


class OllamaEmbeddingsRequest(_Embedding):
    """``POST /api/embeddings`` (Ollama's older endpoint)."""

    prompt: Text = Field("", description="the text; empty: load only")


def embed_request(
    body: OllamaEmbedRequest | OllamaEmbeddingsRequest, namespace: str = ""
) -> EmbeddingRequest | None:
    """The engine's request for ``body`` (None: nothing to embed, the request only loads)."""
    if isinstance(body, OllamaEmbeddingsRequest):
        inputs: tuple[str, ...] = (body.prompt,) if body.prompt else ()
        truncate, dimensions = True, None
    else:
        inputs = (body.input,) if isinstance(body.input, str) else tuple(body.input)
        inputs = () if inputs == ("",) else inputs
        truncate, dimensions = body.truncate is not False, body.dimensions
    if not inputs:
        return None
    return EmbeddingRequest(
        inputs,
        dimensions=dimensions,
        truncate=truncate,
        cache_namespace=with_salt(namespace, body.cache_salt),
    )


def embed_reply(model: str, result: EmbeddingResult | None, arrived: float) -> dict[str, Any]:
    """``/api/embed``'s answer (``result`` None: the request only loaded)."""
    total = max(0.0, time.monotonic() - arrived)
    if result is None:
        return {"model": model, "embeddings": []}
    return {
        "model": model,
        "embeddings": [list(vector) for vector in result.vectors],
        "total_duration": int(total * NS),
        "load_duration": int(max(0.0, total - result.total_s) * NS),
        "prompt_eval_count": result.prompt_tokens,
        "radixchat": {"cached_tokens": result.cached_tokens, "pooling": result.pooling},
    }


def embeddings_reply(result: EmbeddingResult | None) -> dict[str, Any]:
    """``/api/embeddings``' answer: the one vector (empty for an empty prompt, as Ollama's)."""
    return {"embedding": list(result.vectors[0]) if result is not None else []}
