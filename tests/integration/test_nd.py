"""engine=nd on CPU processes under torchrun: tensor, sequence/loss, pipeline (every schedule, virtual and
uneven stages) and 2-D compositions with FSDP2 train like one process (fp32 losses within 1e-5), hold
exactly the predicted bytes on every rank, and save the predicted activations (within 10%).

The reference is plain torch in this process: the same seeded Hugging Face model, every data-parallel rank's
micro-batches as one batch, AdamW and gradient clipping as nd configures them.
"""

import json
from functools import lru_cache
from pathlib import Path

import pytest

from harness.config.compose import compose_run_config
from harness.engines import nd_plans
from harness.modeling.model import build_model
from harness.plan.parallel_dims import ParallelDims
from harness.plan.pipeline import V_SCHEDULES
from tests.integration.reference import single_process_losses
from tests.integration.runs import prepare_and_launch

pytestmark = pytest.mark.integration

# Two warm-up steps (the second measures state bytes) and one timed step: three losses to compare.
BASE = ["tracking=disabled", "bench.warmup_steps=2", "bench.warmup_max_steps=2", "bench.steps=1", "layout.precision=fp32"]
FP32_RTOL = 1e-5
ACTIVATION_RTOL = 0.10
TIMEOUT_S = 600
FOUR = "cluster.accelerators_per_node=4"
# Wall-clock seconds of each run, printed at the end of the session (`-s`) and kept with each test's report.
WALL_TIMES = {}


def run_nd(overrides, run_dir: Path):
    cfg = compose_run_config([*BASE, *overrides])
    result, plan, seconds = prepare_and_launch(cfg, run_dir, TIMEOUT_S)
    memory = plan["memory"]
    return cfg, result["measured"], {**result["predicted"], "pp_rank": memory["pp_rank"]}, seconds


@lru_cache(maxsize=None)
def reference(hf_config_json: str, rows: int, grad_accum: int, n_steps: int, grad_clip: float = None,
              lr: float = None):
    """Per-step mean losses of one process that sees every data-parallel rank's micro-batches at once
    (the harness's default learning rate and clip norm unless given)."""
    cfg = compose_run_config(BASE)
    return single_process_losses(cfg, json.loads(hf_config_json), rows, grad_accum, n_steps, lr=lr,
                                 grad_clip=grad_clip)[0]


def check_run(name, overrides, results_root, record_property):
    cfg, measured, predicted, seconds = run_nd(overrides, results_root / name)
    WALL_TIMES[name] = seconds
    record_property("wall_time_s", round(seconds, 1))
    layout = cfg.layout
    rows = layout.micro_batch * ParallelDims.of(layout).dp
    want = reference(json.dumps(cfg.model.hf_config, sort_keys=True), rows, layout.grad_accum, len(measured["losses"]))
    assert measured["losses"] == pytest.approx(want, rel=FP32_RTOL)
    by_rank = {r["rank"]: r for r in measured["per_rank"]}
    assert sorted(by_rank) == list(range(ParallelDims.of(layout).world_size))
    for rank, record in by_rank.items():
        exact = nd_plans.predicted_state_bytes(cfg.model.hf_config, layout, rank)
        assert {k: record[k] for k in exact} == exact, f"rank {rank}"
    # The planner's figure is for the pipeline rank it reports (plan.json memory.pp_rank); its first rank.
    stage_rank = predicted["pp_rank"] * (ParallelDims.of(layout).world_size // layout.pp)
    for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        assert by_rank[stage_rank][key] == predicted[key], key
    # Both sides name the rank that needs the most memory: the saved activations of its in-flight
    # micro-batches are predicted within 10%.
    assert measured["activation_bytes"] == pytest.approx(predicted["activation_bytes"], rel=ACTIVATION_RTOL)
    return cfg, measured, by_rank


def full_model_bytes(cfg):
    return 4 * sum(p.numel() for p in build_model(cfg.model.hf_config, 0).parameters())


def test_tp2(results_root, record_property):
    cfg, _, by_rank = check_run("tp2", ["recipes=cpu_nd_tp2", "engine.sequence_parallel=false",
                                        "engine.loss_parallel=false"], results_root, record_property)  # fmt: skip
    assert all(r["param_bytes"] < 0.6 * full_model_bytes(cfg) for r in by_rank.values())


def test_tp2_sequence_and_loss_parallel(results_root, record_property):
    cfg, measured, _ = check_run("tp2_sp_lp", ["recipes=cpu_nd_tp2"], results_root, record_property)
    assert cfg.engine.sequence_parallel and cfg.engine.loss_parallel


def test_pp2_1f1b(results_root, record_property):
    cfg, _, by_rank = check_run("pp2_1f1b", ["recipes=cpu_nd_pp2"], results_root, record_property)
    assert cfg.layout.pp_schedule == "1F1B"
    assert by_rank[0]["param_bytes"] + by_rank[1]["param_bytes"] == full_model_bytes(cfg)


def test_pp2_gpipe(results_root, record_property):
    check_run("pp2_gpipe", ["recipes=cpu_nd_pp2", "layout.pp_schedule=GPipe"], results_root, record_property)


def test_pp2_interleaved_1f1b_virtual_stages(results_root, record_property):
    """Four layers in four stages, two per rank (loop placement: rank 0 holds stages 0 and 2)."""
    cfg, _, by_rank = check_run(
        "pp2_interleaved",
        ["recipes=cpu_nd_pp2", "layout.pp_schedule=Interleaved1F1B", "layout.pp_virtual_stages=2",
         "model.hf_config.num_hidden_layers=4"],
        results_root, record_property,
    )  # fmt: skip
    assert by_rank[0]["param_bytes"] + by_rank[1]["param_bytes"] == full_model_bytes(cfg)


FOUR_LAYERS = "model.hf_config.num_hidden_layers=4"


@pytest.mark.parametrize("schedule", ["LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"])
def test_pp2_two_stages_per_rank(schedule, results_root, record_property):
    """Loop placement (rank 0 holds stages 0 and 2) or, for ZBV and DualPipeV, V placement (rank 0 holds the
    first and the last stage: the embedding and the lm_head)."""
    cfg, _, by_rank = check_run(
        f"pp2_{schedule}", ["recipes=cpu_nd_pp2", f"layout.pp_schedule={schedule}", "layout.pp_virtual_stages=2",
                            FOUR_LAYERS], results_root, record_property)  # fmt: skip
    assert by_rank[0]["param_bytes"] + by_rank[1]["param_bytes"] == full_model_bytes(cfg)
    if schedule in V_SCHEDULES:
        assert by_rank[0]["param_bytes"] > by_rank[1]["param_bytes"]


def test_pp2_uneven_split(results_root, record_property):
    """Three layers as an explicit 2 + 1 split: the stages hold different layer counts."""
    cfg, _, by_rank = check_run("pp2_uneven", ["recipes=cpu_nd_pp2", "model.hf_config.num_hidden_layers=3",
                                               "layout.pp_stage_layers=[2,1]"], results_root, record_property)  # fmt: skip
    assert by_rank[0]["param_bytes"] + by_rank[1]["param_bytes"] == full_model_bytes(cfg)


def test_tp2_fsdp2(results_root, record_property):
    cfg, _, by_rank = check_run("tp2_fsdp2", ["recipes=cpu_nd_tp2", "layout=nd_tp2_fsdp2", FOUR],
                                results_root, record_property)  # fmt: skip
    assert all(r["param_bytes"] < 0.3 * full_model_bytes(cfg) for r in by_rank.values())


def test_pp2_fsdp2(results_root, record_property):
    cfg, _, by_rank = check_run("pp2_fsdp2", ["recipes=cpu_nd_pp2", "layout=nd_pp2_fsdp2", FOUR],
                                results_root, record_property)  # fmt: skip
    assert sum(r["param_bytes"] for r in by_rank.values()) == full_model_bytes(cfg)


def teardown_module():
    if WALL_TIMES:
        print("\nnd integration wall times (s): " + ", ".join(f"{k} {v:.1f}" for k, v in WALL_TIMES.items()))
