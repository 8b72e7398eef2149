"""The seam between a request and the engine: the handle both engines' schedulers take
(:class:`core.engine.handle.EngineHandle`) and the prompt worked out once, on a prompt
thread (:class:`core.engine.handle.TokenizedRequest`), never rendered again by the
scheduler."""

from __future__ import annotations

import pytest

from core.distributed.engine import ShardHandle
from core.engine.handle import EngineHandle, RequestHandle, TokenizedRequest
from core.engine.types import ChatMessage, GenerationRequest
from tests.core.engine.helpers import done, finish, handle, load_tiny, scheduler


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load_tiny(tmp_path_factory, "llama")


def test_both_handles_are_what_the_scheduler_takes():
    request = GenerationRequest(prompt_text="hi")
    assert isinstance(RequestHandle(request), EngineHandle)
    assert isinstance(ShardHandle(1, request, None, lambda shard: None), EngineHandle)
    assert not isinstance(object(), EngineHandle)


def test_only_a_chat_rendered_by_the_template_is_templated():
    chat = GenerationRequest(messages=(ChatMessage("user", "hi"),))
    assert TokenizedRequest(chat, (1, 2), load=1).templated
    assert not TokenizedRequest(GenerationRequest(prompt_text="hi"), (1, 2), load=1).templated
    assert not TokenizedRequest(GenerationRequest(prompt_tokens=(1, 2)), (1, 2), load=1).templated


def test_the_scheduler_runs_the_tokens_it_is_given_and_never_renders_again(llama):
    s = scheduler(llama)
    h = handle("a prompt whose rendering is not what runs", max_tokens=3)
    given = (5, 6, 7, 8)  # not the prompt text's ids: only these may reach the model
    h.tokenized = TokenizedRequest(h.request, given, load=0)
    s.admit(h)
    assert h.tokenized is None  # taken: the handle keeps no second copy
    finish(s)
    assert done(h).stats.prompt_tokens == len(given)


def test_a_handle_whose_prompt_is_not_worked_out_is_refused(llama):
    s = scheduler(llama)
    h = handle("never tokenised")
    with pytest.raises(ValueError, match="worked out"):
        s.admit(h)
    other = handle("tokenised for another request")
    h.tokenized = TokenizedRequest(other.request, (5, 6), load=0)
    with pytest.raises(ValueError, match="worked out"):
        s.admit(h)
    assert not s.waiting
