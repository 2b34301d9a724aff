"""A prediction is for ranks with cores of their own; ranks that wait for a core stretch the step by the share of
the time one or another of them waits (they move in lock-step)."""

from __future__ import annotations

import pytest

from harness.plan.time_model import lockstep_wait_share, under_core_wait


def test_one_rank_waiting_half_the_time_doubles_the_step():
    assert lockstep_wait_share([0.5]) == pytest.approx(0.5)
    assert under_core_wait(0.1, [0.5]) == pytest.approx(0.2)


def test_lockstep_ranks_run_only_while_every_one_has_a_core():
    # two ranks each waiting half the time, independently: both run a quarter of the time
    assert lockstep_wait_share([0.5, 0.5]) == pytest.approx(0.75)
    assert under_core_wait(0.1, [0.5, 0.5]) == pytest.approx(0.4)
    assert under_core_wait(0.1, []) == pytest.approx(0.1) == under_core_wait(0.1, [0.0, 0.0])
