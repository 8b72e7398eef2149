"""What rank 0 sends the other ranks of a group (:mod:`core.distributed.wire`): a command
crosses as every input it was made with, through JSON, and comes back the same command."""

from __future__ import annotations

import dataclasses
import json

import pytest

from core.distributed.wire import GROUP_COMMANDS, command_from_dict, command_to_dict
from core.engine.commands import (
    EmbedCommand,
    FlushCommand,
    ForgetCommand,
    GiveWayCommand,
    LoadCommand,
    StopCommand,
)
from core.engine.types import EmbeddingRequest


def crossed(command):
    return command_from_dict(json.loads(json.dumps(command_to_dict(command))))


def test_forgetting_a_session_crosses_with_its_namespace():
    back = crossed(ForgetCommand("trip", "app"))
    assert isinstance(back, ForgetCommand)
    assert (back.session, back.namespace) == ("trip", "app")


@pytest.mark.parametrize("kind", sorted(GROUP_COMMANDS.values(), key=lambda c: c.__name__))
def test_every_input_of_a_command_crosses_and_no_answer_does(kind):
    """Inputs are the fields a command is made with: each one is sent (a field added to a
    command crosses without a change here); what the engine answers stays behind."""
    inputs = {f.name for f in dataclasses.fields(kind) if f.init}
    answers = {f.name for f in dataclasses.fields(kind) if not f.init}
    command = kind(**{name: f"value of {name}" for name in inputs})
    sent = command_to_dict(command)
    assert set(sent) == {"op"} | inputs and not answers & set(sent)
    back = crossed(command)
    assert type(back) is kind
    assert all(getattr(back, name) == getattr(command, name) for name in inputs)


def test_the_commands_a_group_applies_are_the_ones_it_sends():
    assert set(GROUP_COMMANDS.values()) == {
        ForgetCommand,
        FlushCommand,
        GiveWayCommand,
        StopCommand,
    }
    for command in (LoadCommand("m", "auto"), EmbedCommand(EmbeddingRequest(("x",)), [[1]], 1)):
        with pytest.raises(TypeError, match="a group does not apply"):
            command_to_dict(command)
