"""Run-directory records: every record survives a round trip through its file, and unknown keys are kept."""

from __future__ import annotations

import json

import pytest

from harness.rundir import (
    COMPLETED,
    CORRUPT,
    FINAL_STATES,
    Measured,
    Predicted,
    RankError,
    RecordError,
    RunResult,
    RunState,
    Status,
    read_errors,
    read_metrics,
    read_status,
    write_error,
    write_metrics,
    write_status,
)


def measured() -> Measured:
    return Measured(
        tokens_per_s=1000.0, tokens_per_s_per_device=500.0, step_time_s=0.5, step_times_s=[0.5, 0.6],
        tflop_per_s_per_device=1.5, mfu=0.3, hfu=None, peak_flop_per_s_per_device=5e12,
        peak_flops_source="measured:cpu-matmul",
        param_bytes=10, grad_bytes=20, optimizer_bytes=40, activation_bytes=80, host_bytes=0,
        peak_allocated_bytes=None, losses=[5.5, 5.4], loss_first=5.5, loss_final=5.4,
        per_rank=[{"rank": 0, "param_bytes": 10}], nvme_bytes=3,
    )


def result() -> RunResult:
    return RunResult(
        run_id="000-x", sweep="s", engine="fsdp", model="tiny_llama", world_size=2, layout={"tp": 1},
        cluster={"name": "cpu"}, flop_convention="6N", flops_per_token=6.0, recompute_flops_per_token=0.0,
        tokens_per_step=64, measured=measured(),
        predicted={"param_bytes": 10, "total_bytes": 200, "fits": 1, "step_time_breakdown": {"gemm_s": 0.1}},
    )


def test_states_are_strings_and_the_final_ones_are_named():
    assert RunState("OOM") is RunState.OOM and RunState.OOM == "OOM" and f"{RunState.OOM}" == "OOM"
    assert json.dumps([COMPLETED]) == '["COMPLETED"]'
    assert CORRUPT not in FINAL_STATES and {s.value for s in FINAL_STATES} == {
        "COMPLETED", "FAILED", "OOM", "TIMEOUT", "CANCELLED", "PRUNED"}


def test_metrics_round_trip_through_the_file(tmp_path):
    original = result()
    assert isinstance(original.predicted, Predicted) and original.predicted.fits is True
    write_metrics(tmp_path, original)
    loaded = read_metrics(tmp_path)
    assert loaded == original
    assert loaded.to_dict() == json.loads((tmp_path / "metrics.json").read_text())
    # A key this version does not know (a newer predictor's) is kept as written.
    assert loaded.predicted.extra == {"step_time_breakdown": {"gemm_s": 0.1}}
    assert loaded.to_dict()["predicted"]["step_time_breakdown"] == {"gemm_s": 0.1}


def test_status_and_rank_error_round_trip(tmp_path):
    write_status(tmp_path, RunState.FAILED, "why")
    status = read_status(tmp_path)
    assert (status.state, status.reason) == (RunState.FAILED, "why") and status.time > 0
    assert Status.from_dict(status.to_dict()) == status

    class OutOfMemoryError(RuntimeError):
        pass

    write_error(tmp_path, 10, OutOfMemoryError("CUDA out of memory"))
    write_error(tmp_path, 2, ValueError("x" * 5000))
    errors = read_errors(tmp_path)
    assert [e.rank for e in errors] == [2, 10]  # by rank, not by file name
    assert errors[1].out_of_memory and not errors[0].out_of_memory and len(errors[0].message) == 2000
    assert RankError.from_dict(errors[1].to_dict()) == errors[1]
    assert errors[1].reason() == "rank 10: OutOfMemoryError: CUDA out of memory"


@pytest.mark.parametrize("record, cls, message", [
    ({"state": "DONE"}, Status, "unknown state 'DONE'"),
    ({"reason": "x"}, Status, "status lacks state"),
    ([1, 2], Status, "status is a list"),
    ({"rank": 0}, RankError, "rank error lacks type, message"),
    ({**result().to_dict(), "measured": {"tokens_per_s": 1.0}}, RunResult, "measured lacks"),
])
def test_a_wrong_record_names_what_is_wrong(record, cls, message):
    with pytest.raises(RecordError, match=message):
        cls.from_dict(record)


def test_predicted_state_activation_needs_all_four_terms():
    assert Predicted(param_bytes=1, grad_bytes=2, optimizer_bytes=3, activation_bytes=4).state_activation_bytes == 10
    assert Predicted(param_bytes=1).state_activation_bytes is None


def test_a_standin_result_carries_its_recipe_and_what_it_did_not_execute(tmp_path):
    original = result()
    assert "standin" not in original.to_dict()  # an ordinary run's metrics.json is unchanged
    original.standin = {"of": "gpu_x", "not_executed": ["NCCL collectives (gloo carries them)"]}
    write_metrics(tmp_path, original)
    assert read_metrics(tmp_path).standin == original.standin


def test_metrics_written_before_the_unit_renames_read_back_under_the_new_keys(tmp_path):
    old = measured().to_dict()
    old["tflops_per_device"] = old.pop("tflop_per_s_per_device")
    old["peak_flops_per_device"] = old.pop("peak_flop_per_s_per_device")
    assert Measured.from_dict(old) == measured()
