"""core.models.usage: the record of which model was loaded when, under which fingerprints."""

from __future__ import annotations

import logging

from core.models import usage


def test_a_first_load_into_a_data_folder_not_made_yet_is_recorded(tmp_path, caplog):
    data = tmp_path / "not" / "made"  # an Engine may load before anything made its folder
    with caplog.at_level(logging.WARNING, logger=usage.__name__):
        usage.record_use(data, tmp_path / "m", "m", "fp1", now=5.0)
    assert not caplog.records
    assert usage.read_uses(data)[str(tmp_path / "m")].fingerprints == ("fp1",)


def test_each_fingerprint_is_kept_once_and_forget_drops_the_model(tmp_path):
    usage.record_use(tmp_path, "/m", "m", "fp1", now=1.0)
    usage.record_use(tmp_path, "/m", "m", "fp2", now=2.0)
    usage.record_use(tmp_path, "/m", "m", "fp1", now=3.0)
    use = usage.read_uses(tmp_path)["/m"]
    assert use.fingerprints == ("fp1", "fp2") and use.last_used == 3.0
    assert [u.path for u in usage.uses_under(tmp_path, "/")] == ["/m"]
    usage.forget(tmp_path, ["/m"])
    assert usage.read_uses(tmp_path) == {}


def test_an_unreadable_record_counts_as_empty(tmp_path):
    (tmp_path / usage.USAGE_FILE).write_text("{not json", encoding="utf-8")
    assert usage.read_uses(tmp_path) == {}
