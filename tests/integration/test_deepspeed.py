"""DeepSpeed on 2 CPU processes: every ZeRO stage, offload, AutoTP, checkpointing and accumulation give
the single-process losses, and each rank holds exactly the state bytes the planner predicts."""

import pytest

from tests.integration.runs import failure_report, metrics, run_harness

pytestmark = pytest.mark.integration

COMMON = ["recipes=cpu_zero2", "tracking=disabled", "bench.warmup_steps=2", "bench.warmup_max_steps=2", "bench.steps=2"]
# The single-process reference reads the union of the two ranks' micro-batches at every step.
REFERENCE = ["layout=single", "cluster.accelerators_per_node=1", "layout.micro_batch=4"]
FP32_RTOL = 1e-5
# bf16 keeps 8 mantissa bits: one rounding of a logit is ~2^-9 relative; averaged over 256 tokens the
# loss moves by far less, and 2e-3 relative still catches a wrong batch (those differ by > 5e-3).
BF16_RTOL = 2e-3


def _grid(results_root, name, args):
    proc, run_dirs, seconds = run_harness([*COMMON, *args], results_root / name, timeout=1500)
    assert proc.returncode == 0, failure_report(proc, run_dirs)
    print(f"{name}: {len(run_dirs)} run(s) in {seconds:.1f} s")
    return {d.name.split("-", 1)[0] if d.name[0].isdigit() else d.name: metrics(d) for d in run_dirs}


@pytest.fixture(scope="module")
def fp32_reference(results_root):
    (result,) = _grid(results_root, "ds_ref_fp32", [*REFERENCE, "layout.precision=fp32"]).values()
    return result["measured"]["losses"]


@pytest.fixture(scope="module")
def bf16_reference(results_root):
    (result,) = _grid(results_root, "ds_ref_bf16", [*REFERENCE, "layout.precision=bf16"]).values()
    return result["measured"]["losses"]


def _assert_state_bytes_predicted(result):
    measured, predicted = result["measured"], result["predicted"]
    for key in ("param_bytes", "grad_bytes", "optimizer_bytes", "host_bytes"):
        assert measured[key] == predicted[key], (key, measured[key], predicted[key])
    assert measured["activation_bytes"] == pytest.approx(predicted["activation_bytes"], rel=0.10)


@pytest.fixture(scope="module")
def zero_stages_fp32(results_root):
    return _grid(results_root, "ds_zero_fp32", ["-m", "layout.precision=fp32", "layout.zero_stage=0,1,2,3"])


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_zero_stage_matches_single_process_fp32(zero_stages_fp32, fp32_reference, stage):
    result = next(r for r in zero_stages_fp32.values() if r["layout"]["zero_stage"] == stage)
    assert result["measured"]["losses"] == pytest.approx(fp32_reference, rel=FP32_RTOL)
    _assert_state_bytes_predicted(result)


AXES = {
    "zero3": ["layout.zero_stage=3"],
    "offload_optimizer_zero2": ["layout.offload_optimizer=cpu"],
    "offload_params_zero3": ["layout.zero_stage=3", "layout.offload_optimizer=cpu", "layout.offload_params=cpu"],
    "autotp2_zero1": ["layout.tp=2", "layout.dp_shard=1", "layout.zero_stage=1", "layout.micro_batch=4"],
    "full_checkpointing": ["layout.activation_checkpointing=full"],
    "accumulation2": ["layout.micro_batch=1", "layout.grad_accum=2"],
}


@pytest.mark.parametrize("axis", sorted(AXES))
def test_axis_matches_single_process_bf16(results_root, bf16_reference, axis):
    (result,) = _grid(results_root, f"ds_{axis}", AXES[axis]).values()
    assert result["measured"]["losses"] == pytest.approx(bf16_reference, rel=BF16_RTOL)
    _assert_state_bytes_predicted(result)
