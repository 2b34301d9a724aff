"""Bad input is refused before anything launches, with the field and the numbers in the message."""

import os
import subprocess
import sys

import pytest

from harness import REPO_ROOT


def harness(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=timeout, env={**os.environ, **(env or {})},
    )  # fmt: skip


def _launched(tmp_path) -> bool:
    return any(tmp_path.rglob("rendered.json")) or any(tmp_path.rglob("launch.log"))


def test_world_size_mismatch_names_the_factors(tmp_path):
    out = harness("run", "recipes=cpu_zero2", "layout.dp_shard=4", f"results_dir={tmp_path}")
    assert out.returncode != 0
    # The product of the degrees (4) against the processes there are (1 node x 2).
    assert "dp_shard=4" in out.stderr
    assert "cluster.nodes=1 x cluster.accelerators_per_node=2 = 2" in out.stderr
    assert not _launched(tmp_path)


@pytest.mark.parametrize("field", ["micro_batch", "grad_accum", "seq_len"])
def test_non_positive_batch_fields_are_refused(tmp_path, field):
    out = harness("run", "recipes=cpu_zero2", f"layout.{field}=0", f"results_dir={tmp_path}")
    assert out.returncode != 0
    assert f"{field}=0" in out.stderr
    assert not _launched(tmp_path)


def test_unknown_recipe_is_refused(tmp_path):
    out = harness("run", "recipes=not_a_recipe", f"results_dir={tmp_path}")
    assert out.returncode != 0
    assert "not_a_recipe" in out.stderr
    assert not _launched(tmp_path)


def test_unknown_model_is_refused(tmp_path):
    out = harness("run", "model=not_a_model", f"results_dir={tmp_path}")
    assert out.returncode != 0 and "not_a_model" in out.stderr


def test_unreachable_hub_id_is_a_clear_error(tmp_path):
    out = harness("run", "model.hub_id=some-org/some-model", f"results_dir={tmp_path}",
                  env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode != 0
    assert "model.hub_id='some-org/some-model'" in out.stderr
    assert not _launched(tmp_path)


def test_online_tracking_without_a_key_is_refused(tmp_path, monkeypatch):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    out = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "recipes=cpu_zero2", "tracking=wandb_online",
         f"results_dir={tmp_path}"], cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0 and "WANDB_API_KEY" in out.stderr
    assert not _launched(tmp_path)


def test_hydra_cfg_job_prints_the_composed_config(tmp_path):
    out = harness("run", "recipes=cpu_zero2", "layout.zero_stage=3", "--cfg", "job")
    assert out.returncode == 0, out.stderr
    assert "zero_stage: 3" in out.stdout and "sweep_name: cpu_zero2" in out.stdout


def test_plan_command_prints_a_table_for_a_grid():
    out = harness("plan", "model=llama3_1_70b", "cluster=h100_8x8", "engine=nd", "layout.tp=8",
                  "layout.pp=4", "layout.dp_shard=2", "layout.grad_accum=8", "layout.zero_stage=1,3")
    assert "2 layout(s)" in out.stdout, out.stdout + out.stderr
