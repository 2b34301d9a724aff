"""The compile time a run reports: its first warm-up step (slowest rank) beyond a timed step, only when compiled."""

import pytest

from harness.runtime.bench import compile_time


def test_compile_time_is_the_slowest_first_step_beyond_the_median_step():
    records = [{"warmup_step_times_s": [12.0, 0.3]}, {"warmup_step_times_s": [14.5, 0.2]}]
    assert compile_time(records, 0.25, compiled=True) == {"first_step_s": 14.5, "compile_s": pytest.approx(14.25)}
    assert compile_time(records, 0.25, compiled=False) == {"first_step_s": 14.5, "compile_s": None}
    assert compile_time([{"warmup_step_times_s": []}], 0.25, compiled=True) == {"first_step_s": None,
                                                                                "compile_s": None}
