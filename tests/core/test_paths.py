"""core.paths: what the data folder's stores may take."""

from __future__ import annotations

from core import paths

BUDGET = 64 * 2**20


def test_the_stored_responses_share_is_kept_from_the_first_start(tmp_path):
    """The engine measures the room at the model's load, before the server has created
    responses.db: the share is left to the responses all the same (the soak bench found
    a fresh folder holding an eighth more than its budget until the next start)."""
    assert not paths.responses_db_path(tmp_path).exists()
    room = paths.RESPONSES_FILE_FACTOR * paths.stored_responses_budget(BUDGET)
    assert paths.stored_responses_bytes(tmp_path, BUDGET) == room


def test_a_file_larger_than_the_share_counts_as_it_is(tmp_path):
    big = paths.RESPONSES_FILE_FACTOR * paths.stored_responses_budget(BUDGET) + 12345
    paths.responses_db_path(tmp_path).write_bytes(b"\0" * big)
    assert paths.stored_responses_bytes(tmp_path, BUDGET) == big
