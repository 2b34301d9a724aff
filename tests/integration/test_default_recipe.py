"""The default recipe end to end on 2 CPU processes: DeepSpeed ZeRO-2 bf16 through the real CLI."""

import json
import math

import pytest

from harness.report.wandb_offline import read_offline_config, read_offline_run, read_offline_run_info
from tests.integration.runs import failure_report, metrics, run_harness

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def default_run(results_root):
    proc, run_dirs, seconds = run_harness(["recipes=cpu_zero2"], results_root / "default")
    assert proc.returncode == 0, failure_report(proc, run_dirs)
    assert len(run_dirs) == 1
    print(f"default recipe: {seconds:.1f} s")
    return proc, run_dirs[0]


@pytest.fixture(scope="module")
def single_process_run(results_root):
    proc, run_dirs, _ = run_harness(
        ["recipes=cpu_zero2", "layout.dp_shard=1", "cluster.accelerators_per_node=1", "tracking=disabled"],
        results_root / "single",
    )
    assert proc.returncode == 0, failure_report(proc, run_dirs)
    return run_dirs[0]


def test_default_recipe_writes_sane_metrics(default_run):
    proc, run_dir = default_run
    result = metrics(run_dir)
    measured = result["measured"]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "COMPLETED"
    assert result["world_size"] == 2
    assert measured["tokens_per_s"] > 0
    assert measured["tokens_per_s_per_device"] == pytest.approx(measured["tokens_per_s"] / 2)
    assert len(measured["step_times_s"]) == 8
    # Random init gives near-uniform logits: the first loss is close to ln(vocab).
    assert measured["loss_first"] == pytest.approx(math.log(256), rel=0.10)
    assert measured["mfu"] is not None and 0 < measured["mfu"] < 1
    assert result["flop_convention"] and result["flops_per_token"] > 0
    assert measured["peak_flops_source"].startswith("measured:")
    shares = measured["host"]["core_wait_shares"]  # each rank's wait for a core over its timed steps
    assert len(shares) == 2 and all(0 <= share <= 1 for share in shares)
    assert (run_dir / "ds_config.json").exists() and (run_dir / "config.json").exists()
    assert (run_dir.parent / "summary.csv").exists()
    assert (run_dir.parent / "report.html").exists() and (run_dir.parent / "wandb_report.json").exists()
    assert "COMPLETED" in proc.stdout


def test_zero2_halves_optimizer_state_per_rank(default_run, single_process_run):
    two = metrics(default_run[1])["measured"]
    one = metrics(single_process_run)["measured"]
    assert two["optimizer_bytes"] * 2 == one["optimizer_bytes"]
    assert two["grad_bytes"] * 2 == one["grad_bytes"]
    assert two["param_bytes"] == one["param_bytes"]  # ZeRO-2 keeps whole weights on every rank


def test_prediction_equals_measured_state_bytes(default_run):
    result = metrics(default_run[1])
    predicted, measured = result["predicted"], result["measured"]
    assert measured["param_bytes"] == predicted["param_bytes"]
    assert measured["grad_bytes"] == predicted["grad_bytes"]
    assert measured["optimizer_bytes"] == predicted["optimizer_bytes"]
    assert measured["activation_bytes"] == pytest.approx(predicted["activation_bytes"], rel=0.10)


def test_wandb_offline_run_holds_the_same_final_loss(default_run):
    run_dir = default_run[1]
    files = sorted((run_dir / "wandb").rglob("*.wandb"))
    assert len(files) == 1, files
    history, summary = read_offline_run(files[0])
    result = metrics(run_dir)
    assert summary["loss_final"] == pytest.approx(result["measured"]["loss_final"], rel=1e-9)
    assert [row["loss"] for row in history] == pytest.approx(result["measured"]["losses"], rel=1e-9)


def test_rank0_prints_a_live_line_per_step_kept_in_launch_log(default_run):
    proc, run_dir = default_run
    cfg = json.loads((run_dir / "config.json").read_text())["bench"]
    warmup = metrics(run_dir)["measured"]["warmup_steps"]  # the least, or more until step time was steady
    assert cfg["warmup_steps"] <= warmup <= cfg["warmup_max_steps"]
    total = warmup + cfg["steps"]
    logged = [line for line in (run_dir / "launch.log").read_text().splitlines() if line.startswith("[step ")]
    assert len(logged) == total, logged
    assert logged[-1].startswith(f"[step {total}/{total}] loss ") and "tokens/s | MFU " in logged[-1]
    assert " MiB" in logged[-1] or " GiB" in logged[-1]
    assert "[harness]" in (run_dir / "cli.log").read_text()
    # The same lines reach the console while the run goes, prefixed with the run's name.
    echoed = [line.split("] ", 1)[1] for line in proc.stdout.splitlines() if line.startswith(f"[{run_dir.name}] [step ")]
    assert echoed == logged


def test_wandb_history_is_written_per_step_while_the_run_trains(default_run):
    run_dir = default_run[1]
    (path,) = sorted((run_dir / "wandb").glob("offline-run-*/*.wandb"))
    history, summary = read_offline_run(path)
    result = metrics(run_dir)
    timed = len(result["measured"]["step_times_s"])
    assert [row["step"] for row in history] == list(range(1, len(history) + 1))
    assert sum("tokens_per_s" in row and "mfu" in row and "memory_gib" in row for row in history) == timed
    # Logged step by step, not in one burst at the end: the rows span at least the timed steps' own time.
    span = history[-1]["_timestamp"] - history[0]["_timestamp"]
    assert span >= 0.9 * sum(result["measured"]["step_times_s"]), span
    assert summary["step_time_s"] == pytest.approx(result["measured"]["step_time_s"])  # the median
    info = read_offline_run_info(path)
    assert info["group"] == f"{result['sweep']}-{run_dir.parent.name}" and info["job_type"] == "deepspeed"
    config = read_offline_config(path)
    assert config["plan"]["tokens_per_step"] == result["tokens_per_step"] and config["layout"]["zero_stage"] == 2
