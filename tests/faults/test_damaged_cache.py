"""A KV cache database that cannot be opened is set aside and a new one is built, instead
of running without a disk cache until someone deletes the file."""

from __future__ import annotations

import json

import pytest

from core.cli.main import main

pytestmark = pytest.mark.faults


def turn(capsys, model, data, text) -> dict:
    code = main(
        [
            "chat",
            "--model",
            str(model),
            "--data-dir",
            str(data),
            "--temp",
            "0",
            "--max-tokens",
            "8",
            "--json",
            "--kv-tokens",
            "4096",
            "--session",
            "trip",
            text,
        ]
    )
    assert code == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "content",
    [
        b"this is not a database " * 100,  # not SQLite at all
        # a header, then garbage
        b"SQLite format 3\x00" + b"\x07" * 4000,
    ],
)
def test_an_unreadable_cache_is_set_aside_and_rebuilt(
    capsys, caplog, tiny_model, tmp_path, content
):
    """Today: 'disk cache off' at every start, and the second turn restores nothing."""
    (tmp_path / "kvcache.db").write_bytes(content)
    first = turn(capsys, tiny_model, tmp_path, "Plan a day in Lyon, please.")
    second = turn(capsys, tiny_model, tmp_path, "And the evening?")  # a new engine: from disk
    assert second["restored_tokens"] >= first["prompt_tokens"] + first["completion_tokens"] - 1
    assert (tmp_path / "kvcache.db.damaged-1").read_bytes() == content  # kept for a look
    warnings = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert len(warnings) == 1 and "kvcache.db.damaged-1" in warnings[0]
