"""``radixchat serve``'s API keys: repeated --api-key, a keys file, $RADIXCHAT_API_KEY."""

from __future__ import annotations

import argparse

import pytest

from core.api.server import check_bind
from core.cli.serve import api_keys_of
from core.errors import UserError


def args(keys=(), keys_file=None) -> argparse.Namespace:
    return argparse.Namespace(api_key=list(keys), api_keys_file=keys_file)


def test_keys_from_flags_and_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXCHAT_API_KEY", "from-env")
    keys = tmp_path / "keys.txt"
    keys.write_text("# team keys\nbob-key\n\n  carol-key  \nalice-key\n", encoding="utf-8")
    assert api_keys_of(args(["alice-key"], str(keys))) == ["alice-key", "bob-key", "carol-key"]
    assert api_keys_of(args()) == ["from-env"]  # only when no key is given otherwise
    monkeypatch.delenv("RADIXCHAT_API_KEY")
    assert api_keys_of(args()) == []


def test_bad_keys_files_and_keys_are_one_clear_line(tmp_path):
    with pytest.raises(UserError, match="cannot read the API keys file"):
        api_keys_of(args(keys_file=str(tmp_path / "absent")))
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n", encoding="utf-8")
    with pytest.raises(UserError, match="holds no key"):
        api_keys_of(args(keys_file=str(empty)))
    with pytest.raises(UserError, match="spaces"):
        api_keys_of(args(["two words"]))


def test_beyond_loopback_any_key_will_do():
    check_bind("0.0.0.0", ["a", "b"])
    with pytest.raises(UserError, match="API key"):
        check_bind("0.0.0.0", [])
