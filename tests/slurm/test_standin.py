"""Every GPU recipe that trains runs its CPU stand-in (`standin=cpu`) on the local Slurm cluster through
the recipe's own job template: COMPLETED, losses like one process, every rank's state bytes as planned.

The stand-ins are submitted at once, so Slurm runs them side by side on the two virtual nodes: one
through `harness run` (a one-point submission, followed until its job ends) and the others as one
`harness sweep` (one array per resource shape). Each test then reads its run directory. Only the selected
tests' stand-ins are submitted (`-k gpu_llama70b_nd` runs that one alone).

Each stand-in builds its model as its recipe resolves model.init: the 70B, 405B and Mixtral nd recipes and
the Qwen3 ZeRO-3 recipe on the meta device (nd_session allocates each rank's shards and initialises them as
DTensors; DeepSpeed partitions inside zero.Init).

The loss reference is plain torch in this process, as tests/integration does it: the same seeded model,
every data-parallel rank's micro-batches as one batch, AdamW and clipping as the engines configure them,
and bf16 by hand (fp32 master weights, a bf16 copy for forward and backward, fp32 gradients). A model
built on the meta device (`model.init: meta`: zero.Init, or nd's per-shard initialisation) draws different
weights, so its losses are those of an initialised model on uniform tokens, ln(vocab), as
tests/integration/test_meta_init.py checks.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.commands.gpu_check import planned_state_bytes
from harness.runtime.reference import META_INIT_RTOL, loss_rtol, reference_precision

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
# Megatron-LM recipes are export only: tests/unit/engines/test_megatron_script.py runs their scripts.
RECIPES = sorted(p.stem for p in (REPO / "recipes").glob("gpu_*.yaml") if "megatron" not in p.stem)
# The one submitted by `harness run` (the smallest: one rank); the others go as one sweep.
BY_RUN = "gpu_llama8b_zero3_offload_1gpu"
COMMON = ["tracking=disabled"]
TIMEOUT_S = 1200
WALL_TIMES: dict = {}


def harness_popen(env, args, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *args], cwd=REPO, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)


def selected_recipes(session) -> list:
    """The recipes of the tests this session runs (`harness run` covers BY_RUN, and its own test)."""
    chosen = {item.callspec.params["recipe"] for item in session.items
              if item.module.__name__ == __name__ and hasattr(item, "callspec") and "recipe" in item.callspec.params}
    if any(item.name == "test_harness_run_prints_what_the_standin_does_not_execute" for item in session.items):
        chosen.add(BY_RUN)
    return sorted(chosen)


@pytest.fixture(scope="module")
def standins(slurm_cluster, tmp_path_factory, request) -> dict:
    """{recipe: run directory}, every selected stand-in settled; the harness commands' output beside them."""
    results = tmp_path_factory.mktemp("standin")
    env = dict(slurm_cluster)
    recipes = selected_recipes(request.session)
    swept = [r for r in recipes if r != BY_RUN]
    start = time.monotonic()
    procs = {}
    if swept:
        procs["sweep"] = harness_popen(env, ["sweep", f"recipes={','.join(swept)}", "standin=cpu", *COMMON,
                                             "sweep_name=standin", f"results_dir={results / 'sweep'}"],
                                       results / "sweep.log")
    if BY_RUN in recipes:
        procs["run"] = harness_popen(env, ["run", f"recipes={BY_RUN}", "standin=cpu", *COMMON,
                                           f"results_dir={results / 'run'}"], results / "run.log")
    for name, proc in procs.items():
        proc.wait(timeout=TIMEOUT_S)
        log = (results / f"{name}.log").read_text()
        assert proc.returncode == 0, f"harness {name} exited {proc.returncode}\n{log[-6000:]}"
    print(f"\nstand-ins: {len(recipes)} recipes on Slurm in {time.monotonic() - start:.0f} s wall")
    runs = {}
    for run_dir in sorted(p.parent for p in results.rglob("status.json")):
        recipe = json.loads((run_dir / "config.json").read_text())["standin"]["of"]
        runs[recipe] = run_dir
    assert sorted(runs) == recipes
    if "run" in procs:
        runs["_run_log"] = (results / "run.log").read_text()
    return runs


def recipe_model_init(recipe: str) -> str:
    """How the recipe itself builds its model (model.init resolved at its own size, on its own cluster)."""
    from harness.config.compose import compose_run_config
    from harness.plan.construction import resolved_model_init

    return resolved_model_init(compose_run_config([f"recipes={recipe}"]))


def reference(cfg, n_steps: int):
    """Per-step mean losses of one process that sees every data-parallel rank's micro-batches at once."""
    from harness.plan.parallel_dims import ParallelDims
    from tests.integration.reference import single_process_losses

    layout = cfg.layout
    rows = layout.micro_batch * ParallelDims.of(layout).dp
    return single_process_losses(cfg, cfg.model.hf_config, rows, layout.grad_accum, n_steps,
                                 bf16=reference_precision(layout.precision) == "bf16")[0]


@pytest.mark.parametrize("recipe", RECIPES)
def test_standin_completes_and_trains_like_one_process(recipe, standins, record_property):
    from harness.config.compose import run_config_from_dict
    from harness.plan.parallel_dims import ParallelDims

    run_dir = standins[recipe]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "COMPLETED", status
    assert (run_dir / "job.sbatch").exists() and list(run_dir.glob("slurm-*.out"))
    cfg = run_config_from_dict(json.loads((run_dir / "config.json").read_text()))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    started = json.loads((run_dir / "slurm_job.json").read_text())["started"]
    WALL_TIMES[recipe] = status["time"] - started
    record_property("wall_time_s", round(WALL_TIMES[recipe], 1))
    # What the stand-in does not execute travels with its metrics and is printed in the job's log.
    assert metrics["standin"] == {"of": recipe, "not_executed": cfg.standin.not_executed}
    log = "".join(p.read_text() for p in run_dir.glob("slurm-*.out"))
    assert f"[standin] CPU stand-in of {recipe}" in log
    assert all(item in log for item in cfg.standin.not_executed)
    measured = metrics["measured"]
    by_rank = {record["rank"]: record for record in measured["per_rank"]}
    assert sorted(by_rank) == list(range(ParallelDims.of(cfg.layout).world_size))
    for rank, record in by_rank.items():
        planned = planned_state_bytes(cfg, metrics["predicted"], rank)
        assert {key: record.get(key, 0) for key in planned} == planned, f"rank {rank}"
    losses = measured["losses"]
    assert len(losses) == measured["warmup_steps"] + cfg.bench.steps  # warm-up: until steady, capped
    # The stand-in builds the model as its recipe does (the nd recipes: meta, at their real size).
    model_init = json.loads((run_dir / "plan.json").read_text())["model_init"]
    assert model_init == recipe_model_init(recipe)
    if model_init == "meta":
        assert losses == pytest.approx([math.log(cfg.model.hf_config["vocab_size"])] * len(losses),
                                       rel=META_INIT_RTOL)
        return
    want = reference(cfg, len(losses))
    record_property("loss_rel_error", max(abs(a - b) / abs(b) for a, b in zip(losses, want)))
    assert losses == pytest.approx(want, rel=loss_rtol(cfg))


def test_harness_run_prints_what_the_standin_does_not_execute(standins):
    log = standins["_run_log"]
    assert f"[standin] CPU stand-in of {BY_RUN}; not executed on the stand-in:" in log
    assert "slurm job" in log and "COMPLETED" in log


def teardown_module():
    if WALL_TIMES:
        print("\nstand-in job wall times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(WALL_TIMES.items())))
