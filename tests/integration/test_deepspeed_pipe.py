"""DeepSpeed's PipelineModule / PipelineEngine on 2 CPU processes (pp=2, its own 1F1B): fp32 losses equal one
process's, every rank holds exactly the state bytes the planner predicts for its stage, and the saved
activations of its in-flight micro-batches are predicted within 10%.

The reference is test_nd's: plain torch in this process, the same seeded model and batches, AdamW with the
betas and eps DeepSpeed is given, gradient clipping at the same norm.
"""

import json

import pytest

from harness.config.compose import compose_run_config
from harness.plan.activations import layout_token_activations, rank_activation_bytes
from harness.plan.planner import spec_for
from harness.plan.states import rank_states
from tests.integration.runs import prepare_and_launch
from tests.integration.test_nd import reference

pytestmark = pytest.mark.integration

# Two warm-up steps (the last is metered: saved activations, state bytes) and one timed step.
BASE = ["recipes=cpu_zero1_pp2", "tracking=disabled", "bench.warmup_steps=2", "bench.warmup_max_steps=2", "bench.steps=1",
        "layout.precision=fp32"]  # fmt: skip
FP32_RTOL = 1e-5
ACTIVATION_RTOL = 0.10
TIMEOUT_S = 300
STATE_KEYS = ("param_bytes", "grad_bytes", "optimizer_bytes", "host_bytes")
WALL_TIMES = {}


def predicted_by_pp_rank(cfg):
    """The planner's state and activation bytes for each pipeline rank (plan.json keeps only the largest)."""
    spec, layout = spec_for(cfg.model), cfg.layout
    tok = layout_token_activations(spec, layout, cfg.engine, cfg.cluster.accelerator)
    predicted = {}
    for st in rank_states(spec, layout, cfg.engine.name):
        activations, _ = rank_activation_bytes(tok, layout, st.rank, st.layers, st.first, st.last)
        predicted[st.rank] = {"param_bytes": st.param, "grad_bytes": st.grad, "host_bytes": st.host,
                              "optimizer_bytes": st.master + st.moments + st.optimizer_grad,
                              "activation_bytes": activations}  # fmt: skip
    return predicted


def check_run(name, overrides, results_root, record_property):
    cfg = compose_run_config([*BASE, *overrides])
    result, plan, seconds = prepare_and_launch(cfg, results_root / name, TIMEOUT_S)
    WALL_TIMES[name] = seconds
    record_property("wall_time_s", round(seconds, 1))
    layout, measured = cfg.layout, result["measured"]
    assert layout.pp == 2 and layout.grad_accum >= 2
    dp = layout.dp_replicate * layout.dp_shard
    want = reference(json.dumps(cfg.model.hf_config, sort_keys=True), layout.micro_batch * dp, layout.grad_accum,
                     len(measured["losses"]), cfg.bench.grad_clip, cfg.bench.lr)  # fmt: skip
    assert measured["losses"] == pytest.approx(want, rel=FP32_RTOL)
    # Stage-major ranks (DeepSpeed's PipeDataParallelTopology): rank r runs stage r // dp.
    predicted = predicted_by_pp_rank(cfg)
    for record in measured["per_rank"]:
        expected = predicted[record["rank"] // dp]
        assert {k: record[k] for k in STATE_KEYS} == {k: expected[k] for k in STATE_KEYS}, f"rank {record['rank']}"
        assert record["activation_bytes"] == pytest.approx(expected["activation_bytes"], rel=ACTIVATION_RTOL)
    # The largest rank, as plan.json and metrics.json report it.
    for key in STATE_KEYS:
        assert measured[key] == result["predicted"][key], key
    assert measured["activation_bytes"] == pytest.approx(result["predicted"]["activation_bytes"], rel=ACTIVATION_RTOL)
    return cfg, measured


def test_zero0_two_micro_batches(results_root, record_property):
    check_run("pp2_zero0", ["layout.zero_stage=0", "layout.micro_batch=2", "layout.grad_accum=2"], results_root,
              record_property)  # fmt: skip


def test_zero0_clipping_counts_every_stage(results_root, record_property):
    """A clip norm below the tiny model's gradient norm (~0.87) and a large learning rate: clipping acts on
    every step, and a norm that left out a stage's gradients moves the losses off the reference (measured
    without count_every_stage_in_grad_norm: 0.02% off at the third step, 0.1% at the fifth)."""
    check_run("pp2_zero0_clipped", ["layout.zero_stage=0", "layout.micro_batch=2", "layout.grad_accum=2",
                                    "bench.grad_clip=0.05", "bench.lr=0.02", "bench.steps=3"], results_root, record_property)  # fmt: skip


def test_zero1_four_micro_batches(results_root, record_property):
    cfg, _ = check_run("pp2_zero1", [], results_root, record_property)
    assert (cfg.layout.zero_stage, cfg.layout.grad_accum) == (1, 4)


def test_zero1_uneven_stages_full_checkpointing(results_root, record_property):
    """Four layers split 1 + 3 (layout.pp_stage_layers), each layer recomputed in backward."""
    check_run("pp2_zero1_split_full",
              ["model.hf_config.num_hidden_layers=4", "layout.pp_stage_layers=[1,3]",
               "layout.activation_checkpointing=full", "layout.grad_accum=2"],
              results_root, record_property)  # fmt: skip


def teardown_module():
    if WALL_TIMES:
        times = ", ".join(f"{k} {v:.1f}" for k, v in WALL_TIMES.items())
        print(f"\ndeepspeed pipe integration wall times (s): {times}")
