"""engine=fsdp on CPU processes under the real `accelerate launch`: every sharding strategy really shards
(per-rank bytes) and trains like one process (losses equal a single-process reference).

The reference is plain torch in this process: the same seeded model, the union of the data-parallel ranks'
micro-batches as one batch, AdamW and clipping as the engine has them, and, for bf16, the engine's
precision policy done by hand (fp32 master weights, a bf16 copy for forward and backward, fp32 gradients).
"""

import json
import math
from functools import lru_cache
from pathlib import Path

import pytest

from harness.config.compose import compose_run_config
from tests.integration.reference import single_process_losses
from tests.integration.runs import failure_report, prepare_and_launch, run_harness

pytestmark = pytest.mark.integration

# Two warm-up steps (the second measures state bytes) and one timed step: three losses to compare.
BASE = ["engine=fsdp", "tracking=disabled", "bench.warmup_steps=2", "bench.warmup_max_steps=2", "bench.steps=1", "layout.micro_batch=2"]
FP32_RTOL = 1e-5
# bf16: both sides run the same bf16 forward/backward per sample; they differ only in how bf16 gradients
# are summed (per rank, cast to fp32 and averaged, against once over the whole batch): at most one bf16
# rounding (u = 2^-8) per gradient element. AdamW normalises gradients, so that moves each weight by about
# lr * u = 4e-6 per step, and the loss by a like relative amount (measured: <= 6e-6 after three steps).
# 1e-4 leaves a 15x margin yet is 40x tighter than one bf16 rounding of the loss itself (2^-8 = 3.9e-3):
# a loss, a gradient reduction or master weights kept in bf16 would fail it.
BF16_RTOL = 1e-4
TIMEOUT_S = 600


def compose(overrides):
    return compose_run_config([*BASE, *overrides])


def run_fsdp(overrides, run_dir: Path):
    """Plan, render and launch one run; returns (metrics.json, the plan's prediction, seconds)."""
    cfg = compose(overrides)
    result, _, seconds = prepare_and_launch(cfg, run_dir, TIMEOUT_S)
    return cfg, result["measured"], result["predicted"], seconds


@lru_cache(maxsize=None)
def reference(precision: str, micro_batch: int, dp: int, grad_accum: int, n_steps: int):
    """Per-step mean losses of one process that sees every rank's micro-batches at once, and its model."""
    cfg = compose([f"layout.precision={precision}"])
    losses, model = single_process_losses(cfg, cfg.model.hf_config, micro_batch * dp, grad_accum, n_steps,
                                          bf16=precision == "bf16")
    return tuple(losses), model


def unsharded_bytes(model) -> dict:
    """fp32 parameters and gradients, and AdamW's two fp32 moments, of the whole model."""
    numel = sum(p.numel() for p in model.parameters())
    return {"param_bytes": 4 * numel, "grad_bytes": 4 * numel, "optimizer_bytes": 8 * numel}


CASES = {
    # name: (overrides, processes, data-parallel shard degree the state is divided by)
    "fsdp2_full_shard": (["layout.zero_stage=3", "layout.precision=fp32"], 2, 2),
    "fsdp2_shard_grad_op_accum": (["layout.zero_stage=2", "layout.precision=fp32", "layout.grad_accum=2"], 2, 2),
    "fsdp2_no_shard_accum": (["layout.zero_stage=0", "layout.precision=fp32", "layout.grad_accum=2"], 2, 1),
    # FSDP1's later backward prefetch: the next unit gathered after each unit's gradients (the time model exposes it)
    "fsdp1_full_shard_accum_prefetch_post": (
        ["engine.fsdp_version=1", "engine.backward_prefetch=BACKWARD_POST", "layout.zero_stage=3",
         "layout.precision=fp32", "layout.grad_accum=2"], 2, 2),
    "fsdp1_no_shard_accum": (
        ["engine.fsdp_version=1", "layout.zero_stage=0", "layout.precision=fp32", "layout.grad_accum=2"], 2, 1),
    "fsdp2_checkpointing": (
        ["layout.zero_stage=3", "layout.precision=fp32", "layout.activation_checkpointing=full"], 2, 2),
    "fsdp2_cpu_offload": (
        ["layout.zero_stage=3", "layout.precision=fp32", "layout.offload_params=cpu",
         "layout.offload_optimizer=cpu"], 2, 2),
    "fsdp1_shard_grad_op_bf16": (["engine.fsdp_version=1", "layout.zero_stage=2", "layout.precision=bf16"], 2, 2),
    "hsdp_2x2_accum": (
        ["layout.zero_stage=3", "layout.precision=fp32", "layout.dp_replicate=2", "layout.dp_shard=2",
         "cluster.accelerators_per_node=4", "layout.grad_accum=2"], 4, 2),
}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each case launched once, lazily; wall times are printed at the end of the module."""
    done, times = {}, {}

    def get(name):
        if name not in done:
            overrides, processes, _ = CASES[name]
            done[name] = run_fsdp(overrides, tmp_path_factory.mktemp(name))
            times[name] = done[name][3]
        return done[name]

    yield get
    for name, seconds in times.items():
        print(f"\n  fsdp integration {name}: {seconds:.1f} s wall ({CASES[name][1]} processes)")


@pytest.mark.parametrize("name", list(CASES))
def test_losses_equal_single_process_and_state_is_sharded(name, runs, record_property):
    cfg, measured, predicted, seconds = runs(name)
    record_property("wall_time_s", round(seconds, 1))
    _, processes, shard = CASES[name]
    layout = cfg.layout
    assert len(measured["per_rank"]) == processes
    ref_losses, ref_model = reference(
        layout.precision, layout.micro_batch, layout.dp_replicate * layout.dp_shard, layout.grad_accum,
        len(measured["losses"]),
    )  # fmt: skip
    rtol = BF16_RTOL if layout.precision == "bf16" else FP32_RTOL
    assert measured["losses"] == pytest.approx(list(ref_losses), rel=rtol)
    assert measured["loss_first"] == pytest.approx(math.log(256), rel=0.05)
    # Sharding, proved by bytes: every dimension of the tiny model divides by 2, so each rank holds
    # exactly 1/shard of the single-process fp32 state (fp32 master weights under bf16 too).
    whole = unsharded_bytes(ref_model)
    offloaded = layout.offload_params == "cpu"
    for key, total in whole.items():
        held = [rank[key] for rank in measured["per_rank"]]
        assert held == [0 if offloaded else total // shard] * processes, key
    if offloaded:  # CPU offload: parameters, gradients and Adam moments all sit in host memory
        host = [rank["host_bytes"] for rank in measured["per_rank"]]
        assert host == [sum(whole.values()) // shard] * processes
    # The planner predicts every figure exactly.
    for key in (*whole, "host_bytes"):
        assert measured[key] == predicted[key], key


def test_cpu_fsdp_recipe_runs_through_the_cli(tmp_path, record_property):
    """The preset as a user runs it (`harness run recipes=cpu_fsdp`): bf16 FULL_SHARD over 10 steps."""
    proc, run_dirs, seconds = run_harness(["recipes=cpu_fsdp", "tracking=disabled"], tmp_path)
    record_property("wall_time_s", round(seconds, 1))
    print(f"\n  fsdp integration recipe cpu_fsdp (CLI): {seconds:.1f} s wall (2 processes)")
    assert proc.returncode == 0, failure_report(proc, run_dirs)
    assert len(run_dirs) == 1 and (run_dirs[0] / "accelerate.yaml").exists()
    result = json.loads((run_dirs[0] / "metrics.json").read_text())
    measured, layout = result["measured"], result["layout"]
    assert (result["engine"], layout["zero_stage"], layout["precision"]) == ("fsdp", 3, "bf16")
    ref_losses, ref_model = reference("bf16", layout["micro_batch"], 2, layout["grad_accum"], len(measured["losses"]))
    assert measured["losses"] == pytest.approx(list(ref_losses), rel=BF16_RTOL)
    assert measured["param_bytes"] == unsharded_bytes(ref_model)["param_bytes"] // 2


@pytest.mark.parametrize("name", list(CASES))
def test_saved_activation_bytes_match_the_plan(name, runs):
    """FSDP gathers weights into buffers apart from the sharded storage, so the meter must not count the
    views of gathered parameters (W.t() saved by linear) as activations."""
    _, measured, predicted, _ = runs(name)
    assert measured["activation_bytes"] == pytest.approx(predicted["activation_bytes"], rel=0.10)


def test_activation_checkpointing_keeps_fewer_activations(runs):
    plain = runs("fsdp2_full_shard")[1]["activation_bytes"]
    checkpointed = runs("fsdp2_checkpointing")[1]["activation_bytes"]
    assert checkpointed < plain / 2
