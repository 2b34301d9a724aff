"""W&B online with an unreachable server: the run completes, its results stay, the key stays off disk."""

import json

import pytest

from tests.integration.runs import failure_report, metrics, run_harness

pytestmark = pytest.mark.integration

FAKE_KEY = "local0000000000000000000000000000000000test"  # 40+ chars, the shape of a real key


def test_unreachable_wandb_server_never_costs_the_results(results_root):
    proc, run_dirs, seconds = run_harness(
        ["recipes=cpu_zero2", "tracking=wandb_online", "tracking.init_timeout_s=5", "bench.steps=2"],
        results_root / "tracking_online",
        # Port 9 (discard) on loopback: nothing listens, so every connection is refused at once.
        env={"WANDB_API_KEY": FAKE_KEY, "WANDB_BASE_URL": "http://127.0.0.1:9"},
    )
    assert proc.returncode == 0, failure_report(proc, run_dirs)
    (run_dir,) = run_dirs
    result = metrics(run_dir)
    assert json.loads((run_dir / "status.json").read_text())["state"] == "COMPLETED"
    assert result["measured"]["tokens_per_s"] > 0
    assert result["tracking"]["wandb_error"], "an unreachable server must be recorded, not hidden"
    leaked = [str(p) for p in run_dir.rglob("*") if p.is_file() and FAKE_KEY.encode() in p.read_bytes()]
    assert not leaked, f"the API key was written to {leaked}"
    print(f"online tracking against a closed port: {seconds:.1f} s")
