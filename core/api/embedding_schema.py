"""OpenAI's embeddings wire format: the request body in (pydantic), the reply out.

``POST /v1/embeddings`` takes ``input`` in OpenAI's four shapes (a string, a list of
strings, a list of token ids, a list of lists of token ids), ``encoding_format``
``float`` (lists of numbers) or ``base64`` (each vector's float32 bytes, little-endian, as
OpenAI's client decodes them), ``dimensions`` (the first so many components, scaled to
length 1 again) and our ``cache_salt``; it answers OpenAI's list of ``embedding`` objects
with ``usage.prompt_tokens`` and ``total_tokens``, naming the loaded model (whatever name
the request gave, as every route's reply does).
No HTTP and no engine here: plain values only.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator

from core.api.errors import ApiError
from core.api.wire import CACHE_SALT_TEXT, MAX_SALT_CHARS, ModelCard, Text, WireModel
from core.engine.namespaces import with_salt
from core.engine.types import EmbeddingRequest, EmbeddingResult
from core.errors import ErrorKind, UserError

MAX_INPUTS = 2048  # inputs in one request (OpenAI's limit)
TokenId = Annotated[int, Field(ge=0)]


class EmbeddingsRequest(WireModel):
    """The body of ``POST /v1/embeddings``."""

    input: Text | list[Text] | list[TokenId] | list[list[TokenId]] = Field(
        description="a text, texts, a text as token ids, or texts as token ids"
    )
    model: Text | None = Field(None, description="any name: the loaded model answers")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: lists of numbers; base64: little-endian float32 bytes"
    )
    dimensions: int | None = Field(
        None, ge=1, description="keep the first so many components (scaled to length 1 again)"
    )
    user: Text | None = None
    cache_salt: Text | None = Field(
        None, min_length=1, max_length=MAX_SALT_CHARS, description=CACHE_SALT_TEXT
    )

    @field_validator("input")
    @classmethod
    def _some_input(cls, value):
        if isinstance(value, list):
            if not value:
                raise ValueError("an empty list: nothing to embed")
            if len(value) > MAX_INPUTS:
                raise ValueError(f"{len(value):,} inputs; at most {MAX_INPUTS:,} in one request")
        return value


def to_request(body: EmbeddingsRequest, namespace: str = "") -> EmbeddingRequest:
    """The engine's request for ``body``, in cache ``namespace`` (the API key's) split by
    the body's ``cache_salt``."""
    value = body.input
    if isinstance(value, str):
        inputs: tuple = (value,)
    elif all(isinstance(item, int) for item in value):  # one text as token ids
        inputs = (tuple(value),)
    else:
        inputs = tuple(item if isinstance(item, str) else tuple(item) for item in value)
    return EmbeddingRequest(
        inputs,
        dimensions=body.dimensions,
        cache_namespace=with_salt(namespace, body.cache_salt),
    )


def reply(body: EmbeddingsRequest, card: ModelCard, result: EmbeddingResult) -> dict[str, Any]:
    """OpenAI's answer: one ``embedding`` object per input, in order, and the usage."""
    encode = _base64 if body.encoding_format == "base64" else list
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": encode(vector)}
            for index, vector in enumerate(result.vectors)
        ],
        "model": card.id,  # any name asked is the loaded model, named as every reply names it
        "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
    }


def _base64(vector: tuple[float, ...]) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def refusal(error: UserError) -> ApiError:
    """The API's answer to the engine refusing an embedding request, by the error's kind."""
    kind = error.kind
    if kind in (ErrorKind.MODEL_NOT_LOADED, ErrorKind.OUT_OF_MEMORY):
        return ApiError(503, str(error), type="server_error", code=kind.value)
    if kind is ErrorKind.CONTEXT_TOO_LONG:
        return ApiError(400, str(error), param="input", code=kind.value)
    return ApiError(400, str(error), code="invalid_value")
