"""The draft length (core/engine/draft_length.py): measured step costs per length, the
request's acceptance by position, and the length with the most expected tokens per second."""

from __future__ import annotations

import pytest

from core.engine import drafts
from core.engine.draft_length import Acceptance, StepCosts, best_length
from core.engine.drafts import Drafter


def costs_of(seconds: dict[int, float]) -> StepCosts:
    costs = StepCosts()
    for length, value in seconds.items():
        costs.record(length, value)
    return costs


def test_costs_average_measurements_and_fill_in_lengths_not_measured():
    costs = StepCosts()
    assert not costs.known()
    costs.record(0, 1.0)
    costs.record(4, 2.0)
    assert costs.known()
    costs.record(4, 3.0)  # a moving average: between the two measurements
    assert 2.0 < costs.estimate(4) < 3.0
    costs = costs_of({0: 1.0, 4: 2.0, 8: 4.0})
    assert costs.estimate(2) == pytest.approx(1.5)  # between its measured neighbours
    assert costs.estimate(6) == pytest.approx(3.0)
    assert costs.estimate(16) > costs.estimate(8)  # past them: on the line through them all
    flat = costs_of({0: 1.0, 4: 0.5})  # a draft measured faster than a plain step
    assert flat.estimate(16) >= flat.estimate(0)


def test_acceptance_expects_what_drafts_were_taken():
    whole = Acceptance(16)
    for _ in range(10):
        whole.observe(8, 8)
    expected = whole.expected(16)
    assert expected[0] == 1.0
    assert expected[8] > 7.0  # nearly every token of a draft of 8
    assert expected[16] > expected[8]  # past what was drafted: the last position's rate
    cut = Acceptance(16)
    for _ in range(10):
        cut.observe(8, 2)  # the third token never taken
    expected = cut.expected(16)
    assert expected[2] > 2.5
    assert expected[8] - expected[3] < 0.1


def test_the_length_weighs_acceptance_against_cost():
    taken = Acceptance(16)
    for _ in range(10):
        taken.observe(16, 16)
    flat = costs_of({0: 1.0, 16: 1.0})  # a draft costs what a plain step does: the longest
    assert best_length(taken, flat, 16) == 16
    steep = costs_of({0: 1.0, 16: 9.0})  # half a plain step more per draft token
    short = Acceptance(16)
    for _ in range(10):
        short.observe(8, 3)
    assert 1 <= best_length(short, steep, 16) <= 4
    refused = Acceptance(16)
    for _ in range(10):
        refused.observe(4, 0)
    assert best_length(refused, steep, 16) == 0


def test_a_drafter_weighs_its_drafts_against_measured_costs():
    costs = StepCosts()
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    drafter = Drafter(text, costs=costs)
    assert not drafter.worth_a_look()  # no plain step measured yet: a plain step
    costs.record(0, 1.0)
    costs.record(4, 3.0)
    assert drafter.worth_a_look()
    assert drafter.propose(16) == [4, 5, 6, 7]  # the first draft is tried whatever the costs
    for _ in range(drafts.MISSES_TO_PAUSE - 1):
        drafter.observe(4, 0)  # nothing taken, and a draft costs three plain steps
    assert drafter.propose(16) == []  # a plain step is faster: a pause
    assert drafter.pause == drafter.next_pause // 2
    assert drafter.probe
    drafter.pause = 0
    assert len(drafter.propose(16)) == drafts.FIRST_LENGTH  # then one draft to try again
