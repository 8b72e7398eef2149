"""The engine's command table (``Engine.apply``): one handler for each command of
:mod:`core.engine.commands` and for a request's handle, the table a group's ranks apply
their ticks through too."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from core.engine import commands
from core.engine.engine import Engine
from core.engine.handle import RequestHandle


def command_types() -> list[type]:
    return [
        kind
        for _, kind in inspect.getmembers(commands, inspect.isclass)
        if kind.__module__ == commands.__name__ and dataclasses.is_dataclass(kind)
    ]


def test_every_command_and_a_request_have_a_handler_of_their_own():
    table = Engine.__dict__["apply"].dispatcher
    kinds = command_types()
    assert len(kinds) >= 6  # the walk sees the module's commands
    handlers = [table.dispatch(kind) for kind in [*kinds, RequestHandle]]
    assert table.registry[object] not in handlers  # none falls through to "not a command"
    assert len(set(handlers)) == len(handlers)  # one each
    assert set(commands.WHEN_IDLE) <= set(kinds)


def test_a_value_that_is_no_command_is_a_bug_said_so(tmp_path):
    engine = Engine(tmp_path, None)
    with pytest.raises(TypeError, match="not an engine command"):
        engine.apply("forget everything")
    engine.shutdown()
