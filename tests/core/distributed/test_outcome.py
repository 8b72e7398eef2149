"""How `serve --hosts` reads the end of a group from its processes' lines (MLX's launcher
itself exits 0 whatever became of the ranks)."""

from __future__ import annotations

from core.distributed.outcome import ENDED_PREFIX, GroupOutcome, fault_line, fault_of

WARN = "\x1b[33m[WARN] {} \x1b[0m\n"  # how mlx.launch logs a rank's end (common.log_warning)


def test_a_rank_fault_line_round_trips():
    message = "rank 1 (macbook.local) left the group (connection closed)"
    assert fault_of(fault_line(message) + "\n") == message
    assert fault_of("radixchat: serving tiny at http://127.0.0.1:8000/v1 (Ctrl-C to stop)") is None


def test_the_first_fault_wins_and_names_the_host():
    outcome = GroupOutcome(["studio.local", "macbook.local"])
    assert (
        outcome.read(fault_line("rank 1 (macbook.local) left the group (connection closed)"))
        is not None
    )
    assert (
        outcome.read(fault_line("rank 0 (studio.local) left the group (connection closed)")) is None
    )
    outcome.read(WARN.format("Node with rank 1 exited with code -9"))
    outcome.read(WARN.format("Node with rank 0 exited with code 3"))
    assert outcome.verdict() == "rank 1 (macbook.local) left the group (connection closed)"


def test_a_rank_that_ends_badly_without_a_word_is_named():
    outcome = GroupOutcome(["studio.local", "macbook.local"])
    outcome.read(WARN.format("Node with rank 0 exited with code 0"))
    outcome.read(WARN.format("Node with rank 1 exited with code -9"))
    outcome.read(WARN.format("Node with rank 0 was killed"))
    assert outcome.verdict() == "rank 1 (macbook.local) was killed by SIGKILL"
    failed = GroupOutcome(["studio.local", "macbook.local"])
    failed.read(WARN.format("Node with rank 0 exited with code 2"))
    assert failed.verdict() == "rank 0 (studio.local) exited with code 2"


def test_a_clean_stop_has_no_verdict_and_a_failed_launcher_has_one():
    outcome = GroupOutcome(["a", "b"])
    for line in ("radixchat: stopping\n", "INFO:     Shutting down\n"):
        outcome.read(line)
    assert outcome.verdict() is None
    assert outcome.verdict(2) == "the launcher (mlx.launch) exited with code 2"
    assert ENDED_PREFIX.startswith("radixchat: ")
