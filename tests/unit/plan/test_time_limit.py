"""The time-limit rule: start-up + (warm-up + steps) x predicted step time + the warning lead, against
launcher.time_limit, refused before submission with the fields, the numbers and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import REPO_ROOT
from harness.config.compose import compose_run_config
from harness.plan.planner import make_plan
from harness.plan.time_limit import (
    STARTUP_FIXED_S,
    JobTime,
    limit_seconds,
    plan_job_time,
    plan_time_limit_problem,
    startup_s,
    time_limit_problem,
    warning_lead_s,
)

QWEN3 = "gpu_qwen3_235b_a22b_zero3_128gpu"
QWEN3_STEP_S = 238.7  # the plan's predicted step time for the recipe as first shipped
QWEN3_PARAMS = 235_093_634_560  # Qwen3-235B-A22B's parameters (transformers' meta model)
GPU_RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("gpu_*.yaml"))


@pytest.mark.parametrize("text, seconds", [
    ("30", 1800), ("30:15", 1815), ("01:00:00", 3600), ("1-00:00:00", 86400), ("2-3", 2 * 86400 + 3 * 3600),
    ("1-02:30", 86400 + 2 * 3600 + 1800), ("48:00:00", 48 * 3600), ("UNLIMITED", None), ("infinite", None),
])
def test_slurm_time_formats(text, seconds):
    assert limit_seconds(text) == seconds


def test_a_malformed_limit_names_the_field():
    with pytest.raises(ValueError, match=r"launcher.time_limit='1h'"):
        limit_seconds("1h")


def qwen3_time(limit: str) -> JobTime:
    start = startup_s(QWEN3_PARAMS, "meta", "h100", compiled_ops=False, offload_optimizer="none")
    return JobTime(start, 3 + 10, QWEN3_STEP_S, warning_lead_s(QWEN3_STEP_S), limit_seconds(limit))


def test_qwen3_does_not_fit_one_hour():
    """13 steps x 238.7 s is 51.7 min before any start-up, head-room or time to write the partial result."""
    need = qwen3_time("01:00:00")
    assert 13 * QWEN3_STEP_S / 60 == pytest.approx(51.7, abs=0.05)
    assert need.startup_s == pytest.approx(STARTUP_FIXED_S + QWEN3_PARAMS / 1e10)
    assert need.lead_s == 359  # ceil(1.25 x 238.7 + 60)
    assert need.needed_s / 60 == pytest.approx(72.0, abs=0.1)
    assert not need.fits
    assert qwen3_time("01:30:00").fits


def test_refusal_names_the_fields_the_numbers_and_the_fix():
    cfg = compose_run_config([f"recipes={QWEN3}", "launcher.time_limit=01:00:00"])
    problem = time_limit_problem(cfg, QWEN3_STEP_S, QWEN3_PARAMS, "meta")
    for part in ("launcher.time_limit=01:00:00 (60 min)", "13 steps x 238.7 s", "bench.warmup_steps=3",
                 "bench.steps=10", "= 72.0 min", "set launcher.time_limit=01:13:00 or more, or fewer bench.steps"):
        assert part in problem, (part, problem)


def test_only_slurm_runs_with_a_predicted_step_are_checked():
    cfg = compose_run_config([f"recipes={QWEN3}", "launcher.time_limit=01:00:00"])
    assert time_limit_problem(cfg, None, QWEN3_PARAMS, "meta") is None
    local = compose_run_config([f"recipes={QWEN3}", "launcher=local"])
    assert time_limit_problem(local, QWEN3_STEP_S, QWEN3_PARAMS, "meta") is None
    unlimited = compose_run_config([f"recipes={QWEN3}", "launcher.time_limit=UNLIMITED"])
    assert time_limit_problem(unlimited, QWEN3_STEP_S, QWEN3_PARAMS, "meta") is None


def test_startup_counts_host_init_and_jit_builds():
    host = startup_s(8_000_000_000, "full", "h100", compiled_ops=True, offload_optimizer="cpu")
    assert host == pytest.approx(STARTUP_FIXED_S + 8e9 / 4.4e7 + 390)
    assert startup_s(8_000_000_000, "meta", "h100", compiled_ops=True, offload_optimizer="none") == \
        pytest.approx(STARTUP_FIXED_S + 8e9 / 1e10 + 184)


def test_the_lead_covers_a_step_and_the_write():
    assert warning_lead_s(None) == 120
    assert warning_lead_s(2.0) == 63
    assert warning_lead_s(1e6) == 65535


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_every_gpu_recipe_fits_its_time_limit(recipe):
    cfg = compose_run_config([f"recipes={recipe}"])
    plan = make_plan(cfg)
    if cfg.engine.name == "megatron_lm":  # an export: never launched by the harness
        return
    assert plan_time_limit_problem(cfg, plan) is None


def test_plan_output_shows_the_refusal():
    """`harness plan`'s rows carry the rule's problem (a one-minute limit: start-up alone takes longer)."""
    from harness.report.plan_view import plan_points

    (point,) = plan_points([f"recipes={QWEN3}", "launcher.time_limit=1"])
    assert any(error.startswith("launcher.time_limit=1 (1 min) is shorter than the run") for error in point.errors)
    # --json / --csv carry the job's time beside its limit (minutes)
    (point,) = plan_points([f"recipes={QWEN3}"])
    need = plan_job_time(compose_run_config([f"recipes={QWEN3}"]), point.plan)
    assert point.row["job_time_min"] == pytest.approx(need.needed_s / 60) and point.row["time_limit_min"] == 90
    assert not point.errors


def test_prepare_refuses_before_anything_is_written_for_slurm(tmp_path: Path):
    from harness.launch.prepare import RunRejected, prepare_run
    from harness.rundir import PRUNED, read_status

    cfg = compose_run_config([f"recipes={QWEN3}", "launcher.time_limit=1"])
    with pytest.raises(RunRejected, match=r"launcher.time_limit=1 \(1 min\) is shorter than the run"):
        prepare_run(cfg, tmp_path / "run")
    assert read_status(tmp_path / "run").state == PRUNED
    assert not (tmp_path / "run" / "job.sbatch").exists()


def test_a_local_run_is_judged_against_its_timeout_with_no_warning_lead():
    from harness.plan.time_limit import local_timeout_problem
    cfg = compose_run_config([f"recipes={QWEN3}", "launcher=local", "launcher.timeout_s=120"])
    plan = make_plan(cfg)
    problem = local_timeout_problem(cfg, plan)
    assert problem.startswith("launcher.timeout_s=120 (2 min) is shorter than the run"), problem
    assert "+ 0 s warning lead" in problem and "set launcher.timeout_s=" in problem
    need = int(problem.rsplit("set launcher.timeout_s=", 1)[1].split()[0])
    roomy = compose_run_config([f"recipes={QWEN3}", "launcher=local", f"launcher.timeout_s={need}"])
    assert local_timeout_problem(roomy, plan) is None
    assert local_timeout_problem(compose_run_config([f"recipes={QWEN3}"]), plan) is None  # Slurm: its own rule
