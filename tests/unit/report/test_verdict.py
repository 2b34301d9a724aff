"""The one verdict: a winner named only when the interval excludes zero, like-for-like differences flagged,
and repeats of a point pooled and run interleaved."""

from __future__ import annotations

import math
import random

import pandas as pd

from harness.launch.points import interleaved
from harness.report.headline import headline
from harness.report.repeats import pool_repeats
from harness.report.verdict import disturbed, verdict


def row(median_s: float, seed: int, noise: float = 0.02, n: int = 10, tokens: int = 1024, **extra):
    rng = random.Random(seed)
    return {"step_times_s": [median_s * math.exp(rng.gauss(0, noise)) for _ in range(n)], "tokens_per_step": tokens,
            "seq_len": 64, "model": "tiny_llama", **extra}


def test_a_real_difference_is_stated_with_its_interval():
    judged = verdict(row(0.110, 1), row(0.100, 2), "zero3", "zero2")
    assert judged.significant and judged.faster == "zero2"
    assert judged.text.startswith("zero2 is faster than zero3 by ")
    assert "(95% CI " in judged.text and "% in tokens/s" in judged.text
    assert -0.15 < judged.difference.estimate < -0.05  # zero3 against zero2: about 1 / 1.1 - 1


def test_no_winner_without_significance_and_the_repeats_to_separate_them():
    judged = verdict(row(0.100, 3, noise=0.05), row(0.102, 4, noise=0.05), "A", "B")
    assert not judged.significant and judged.faster is None
    assert judged.text.startswith("no significant difference between A and B at this sample size (")
    assert ("run with bench.repeats=" in judged.text) or ("more than 50 repeats" in judged.text)


def test_a_disturbed_run_names_no_winner_however_narrow_its_interval():
    """Host contention slows a whole run: a 2x gap with a tight step-to-step interval is no evidence then."""
    import numpy as np

    for flag in (True, np.bool_(True)):
        judged = verdict(row(0.200, 7, host_disturbed=flag), row(0.100, 8, host_disturbed=False), "zero1", "zero2")
        assert judged.difference.significant and not judged.significant and judged.faster is None
        assert judged.text.startswith("zero1 and zero2 cannot be ranked: zero1 ran while other processes")
        assert "rerun it on a quiet host" in judged.text and judged.repeats_needed is None
    quiet = verdict(row(0.200, 7, host_disturbed=False), row(0.100, 8, host_disturbed=float("nan")), "a", "b")
    assert quiet.faster == "b"
    frame = pd.DataFrame([{**row(0.1, 9, host_disturbed=False), "label": "fast", "series": "s"},
                          {**row(0.2, 10, host_disturbed=True), "label": "slow", "series": "s"}])
    assert disturbed(frame.iloc[1].to_dict()) and not disturbed(frame.iloc[0].to_dict())


def test_different_global_batches_are_flagged():
    judged = verdict(row(0.2, 5, tokens=2048), row(0.1, 6, tokens=1024), "mb4", "mb2")
    assert "different global batches: 2,048 tokens per step vs 1,024 tokens per step" in judged.text
    assert "compared by tokens/s" in judged.text


def repeated_frame(medians_by_repeat, label="A", series="s", point="p"):
    rows = []
    for k, median in enumerate(medians_by_repeat):
        r = row(median, 10 + k, n=8)
        rows.append({**r, "series": series, "point": point, "repeat": k, "repeats": len(medians_by_repeat),
                     "status": "COMPLETED", "run": f"{label}-r{k}", "label": label, "run_dir": f"/x/{label}-r{k}",
                     "step_time_s": sorted(r["step_times_s"])[4], "tokens_per_s": 1024 / sorted(r["step_times_s"])[4],
                     "tokens_per_s_per_device": 512 / sorted(r["step_times_s"])[4], "world_size": 2, "fits": True,
                     "mfu": None, "hfu": None, "tflop_per_s_per_device": None, "step_time_predicted_s": None})
    return pd.DataFrame(rows)


def test_repeats_pool_into_one_row_and_each_stays_inspectable():
    frame = repeated_frame([0.10, 0.11, 0.09])
    pooled = pool_repeats(frame)
    assert len(pooled) == 1 and pooled.iloc[0]["repeats"] == 3
    assert len(pooled.iloc[0]["step_times_s"]) == 24 and len(pooled.iloc[0]["step_times_by_repeat"]) == 3
    assert pooled.iloc[0]["repeat_runs"] == "A-r0, A-r1, A-r2"
    first = pooled.iloc[0]
    assert first["tokens_per_s_ci_low"] < first["tokens_per_s"] < first["tokens_per_s_ci_high"]
    assert len(pool_repeats(pooled)) == 1  # pooling twice changes nothing


def test_the_headline_pools_repeats_before_it_judges():
    frame = pd.concat([repeated_frame([0.10, 0.10, 0.10], "A", point="a"),
                       repeated_frame([0.13, 0.13, 0.13], "B", point="b")], ignore_index=True)
    answer = headline(frame, "s")
    assert answer.text.startswith("Use A: ") and "A is faster than B by " in answer.detail


def test_repeats_run_interleaved_each_round_reversed():
    assert interleaved(3, [3, 3, 3]) == [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1), (0, 2), (1, 2), (2, 2)]
    assert interleaved(2, [1, 2]) == [(0, 0), (1, 0), (1, 1)]


def test_the_headline_names_the_coverage_its_interval_really_has():
    """Two timed steps give a 50% interval of the median: it was printed as "95% CI"."""
    from harness.rundir.vocabulary import ci_words

    assert ci_words({"step_time_ci_level": 0.5}) == "50% CI" and ci_words({"step_time_ci_level": 0.961}) == "96% CI"
    assert ci_words({}) == ci_words({"step_time_ci_level": float("nan")}) == "95% CI"
    best = {**row(0.1, 11), "label": "zero2", "series": "s", "status": "COMPLETED", "tokens_per_s": 10240.0,
            "tokens_per_s_per_device": 5120.0, "tokens_per_s_ci_low": 9000.0, "tokens_per_s_ci_high": 11000.0,
            "step_time_ci_level": 0.5, "fits": True, "world_size": 2, "run_dir": "a"}
    answer = headline(pd.DataFrame([best])).text
    assert "[50% CI 9,000–11,000]" in answer and "95% CI" not in answer


def test_the_hover_sets_measured_memory_beside_the_prediction_of_the_same_thing():
    """A CPU run's states and activations (1.7 MiB) were shown beside the predicted total with its allowance
    (2.1 MiB); a GPU run's allocator peak is compared with the total."""
    from harness.report.plots import memory_hover_lines

    gib = 2 ** -10  # 1 MiB in GiB
    cpu = {"mem_state_activation_gib": 1.7 * gib, "mem_predicted_state_activation_gib": 1.7 * gib,
           "mem_predicted_gib": 2.1 * gib, "mem_allocated_peak_gib": None}
    assert memory_hover_lines(cpu) == ["memory measured (states + activations): 1.7 MiB",
                                       "memory predicted (states + activations): 1.7 MiB; total with allowance "
                                       "2.1 MiB"]
    gpu = {**cpu, "mem_allocated_peak_gib": 60.0, "mem_predicted_gib": 62.0}
    assert memory_hover_lines(gpu) == ["memory measured (allocator peak): 60.00 GiB",
                                       "memory predicted (total): 62.00 GiB"]
