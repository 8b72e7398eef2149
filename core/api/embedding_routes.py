"""``POST /v1/embeddings`` (OpenAI): vectors from the loaded model (``Engine.embed``); and
:func:`run_embedding`, what it and Ollama's ``/api/embed`` share.

The body is checked here (:mod:`core.api.embedding_schema`), the inputs are tokenised on a
worker thread, the forward passes run on the engine thread between the running streams'
decode steps, and the reply (possibly megabytes of numbers) is encoded on a worker thread:
the event loop only waits. Behind the same guard as every route (API key, Host, Origin,
JSON body limits); the request counts in ``/metrics`` and the app's request log.
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.embedding_schema import EmbeddingsRequest, refusal, reply, to_request
from core.api.errors import shutting_down
from core.api.routing import JsonRoute, key_namespace, named, server_of
from core.engine.types import EmbeddingRequest, EmbeddingResult, RequestStats
from core.errors import UserError

router = APIRouter(route_class=JsonRoute)


@router.post("/v1/embeddings", summary="Embeddings of texts or token ids (OpenAI)")
async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    arrived = time.monotonic()
    api = server_of(request)
    card = api.model_card()
    embedding = to_request(body, key_namespace(request))
    result = await run_embedding(request, embedding, arrived)
    data = await asyncio.to_thread(lambda: json.dumps(reply(body, card, result)).encode())
    return named(Response(data, media_type="application/json"), embedding.cache_namespace)


async def run_embedding(
    request: Request, embedding: EmbeddingRequest, arrived: float
) -> EmbeddingResult:
    """``embedding``'s vectors from the engine (waited for off the event loop), counted in
    the metrics and the request log; an :class:`ApiError` for what the engine refuses."""
    api = server_of(request)
    if api.stopping:
        raise shutting_down()
    path = request.url.path
    try:
        result = await asyncio.to_thread(api.engine.embed, embedding)
    except UserError as exc:
        api.request_log.record_error(path, str(exc))
        raise refusal(exc) from None
    stats = RequestStats(
        prompt_tokens=result.prompt_tokens,
        cached_tokens=result.cached_tokens,
        computed_tokens=result.prompt_tokens - result.cached_tokens,
        total_s=result.total_s,
    )
    waited = time.monotonic() - arrived
    api.metrics.record_generation(stats, waited)
    api.request_log.record(path, stats, waited)
    return result
