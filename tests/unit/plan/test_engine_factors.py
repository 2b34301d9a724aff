"""The refit of per-engine efficiency factors recovers known factors from synthetic runs, and a profile's factors
scale every prediction of that engine's layouts (and only that engine's)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.config.compose import compose_run_config
from harness.engines.admission import judge
from harness.plan.engine_factors import FACTOR_RANGE, Sample, median_error, parts, refit, relative
from harness.plan.hardware import HARDWARE, PROFILE_VERSION, save_profile


def synthetic(engine, factors, layouts):
    return [Sample(engine, c, x, factors["compute"] * c + factors["comm"] * x) for c, x in layouts]


def test_the_refit_recovers_known_factors_per_engine():
    true = {"deepspeed": {"compute": 1.7, "comm": 0.6}, "fsdp": {"compute": 0.8, "comm": 2.5}}
    samples = (synthetic("deepspeed", true["deepspeed"], [(1.0, 0.2), (0.5, 0.5), (2.0, 0.1), (0.7, 0.9)])
               + synthetic("fsdp", true["fsdp"], [(0.3, 0.3), (1.2, 0.05), (0.9, 0.6)]))
    fitted = refit(samples, {"nd": {"compute": 1.3, "comm": 1.1}})
    for engine, factors in true.items():
        assert fitted[engine] == pytest.approx(factors, rel=1e-6)
    assert fitted["nd"] == {"compute": 1.3, "comm": 1.1}  # an engine without runs keeps its factors
    ds = [s for s in samples if s.engine == "deepspeed"]
    assert median_error(ds) > 0.2
    assert median_error(ds, relative(fitted["deepspeed"], None)) == pytest.approx(0.0, abs=1e-9)


def test_the_refit_compounds_with_the_current_factors_and_is_clamped():
    # predictions already made under compute 2.0 / comm 2.0 that ran 1.5x slower still
    samples = synthetic("nd", {"compute": 1.5, "comm": 1.5}, [(1.0, 0.0), (2.0, 0.0)])
    assert refit(samples, {"nd": {"compute": 2.0, "comm": 2.0}})["nd"] == pytest.approx({"compute": 3.0, "comm": 3.0})
    wild = synthetic("nd", {"compute": 500.0, "comm": 500.0}, [(1.0, 0.1), (1.0, 0.5)])
    assert refit(wild, {})["nd"] == {"compute": FACTOR_RANGE[1], "comm": FACTOR_RANGE[1]}


def test_a_profiles_factors_scale_that_engines_prediction_part_by_part(tmp_path):
    """The factors are read from the profile file cluster.profile names, and only for the engine they name."""
    plain, tuned = tmp_path / "plain.json", tmp_path / "tuned.json"
    base = replace(HARDWARE["h100_sxm"], version=PROFILE_VERSION)
    save_profile(base, plain)
    save_profile(replace(base, engine_factors={"fsdp": {"compute": 2.0, "comm": 3.0}}), tuned)

    def predicted(engine, path):
        cfg = compose_run_config(["model=tiny_llama", f"engine={engine}", "cluster=h100_8x8", "cluster.nodes=1",
                                  f"cluster.profile={path}"])
        return judge(cfg).plan.time

    before, after = predicted("fsdp", plain), predicted("fsdp", tuned)
    (c, x), (tc, tx) = parts(before), parts(after)
    assert x > 0 and (tc, tx) == pytest.approx((2.0 * c, 3.0 * x))
    assert after.step_time_s == pytest.approx(2.0 * c + 3.0 * x)
    assert sum(after.compute_s.values()) == pytest.approx(2.0 * sum(before.compute_s.values()))
    assert predicted("deepspeed", tuned).step_time_s == predicted("deepspeed", plain).step_time_s
