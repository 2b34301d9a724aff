"""A layout left open is filled from the cluster and the model; what the user gives is kept; CPU stays the toy."""

import os
import subprocess
import sys
from dataclasses import asdict

import pytest
import yaml

from harness import REPO_ROOT
from harness.config.compose import compose_noting_fills, compose_run_config
from harness.config.fill import CPU_TOY, DegreeFillError


def test_gpu_cluster_without_a_layout_fills_the_world_and_the_models_length():
    run, note = compose_noting_fills(["model=llama3_1_70b", "cluster=h100_8x8"])
    layout = run.layout
    assert (layout.dp_shard, layout.tp, layout.pp) == (64, 1, 1)
    assert (layout.zero_stage, layout.micro_batch, layout.seq_len) == (3, 1, 8192)
    assert layout.activation_checkpointing == "full" and layout.name == "dp64_zero3"
    for text in ("cluster=h100_8x8", "layout.dp_shard=64", "layout.zero_stage=3", "layout.micro_batch=1",
                 "layout.seq_len=8192 (model.train_seq_len of llama3_1_70b)", "layout.activation_checkpointing=full"):
        assert text in note


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp", "fsdp1", "nd", "megatron_lm"])
def test_every_engine_plans_its_filled_layout_as_valid(engine):
    """The open ZeRO stage takes the engine's most sharded one: ZeRO-3, or the Megatron-LM export's distributed
    optimizer (ZeRO-3 there was refused, so every Megatron-LM plan without a layout was invalid)."""
    from harness.plan.planner import make_plan

    run, note = compose_noting_fills(["model=llama3_1_8b", "cluster=gpu_h100_1x8", f"engine={engine}"])
    plan = make_plan(run)
    assert plan.valid, plan.errors
    assert run.layout.zero_stage == (1 if engine == "megatron_lm" else 3)
    assert f"layout.zero_stage={run.layout.zero_stage}" in note and run.layout.name.endswith(
        f"zero{run.layout.zero_stage}")


def test_fields_the_user_sets_win_over_the_fill():
    run, note = compose_noting_fills(["model=llama3_1_8b", "cluster=gpu_h100_1x8", "layout.seq_len=2048",
                                      "layout.micro_batch=4", "layout.activation_checkpointing=none", "layout.tp=2"])
    layout = run.layout
    assert (layout.seq_len, layout.micro_batch, layout.activation_checkpointing) == (2048, 4, "none")
    # Only what was left open is filled: dp_shard covers the ranks tp=2 leaves, ZeRO-3 as unset.
    assert (layout.dp_shard, layout.tp, layout.zero_stage, layout.name) == (4, 2, 3, "dp4_tp2_zero3")
    assert "seq_len" not in note and "micro_batch" not in note and "layout.dp_shard=4 (8 ranks / 2)" in note
    # A chosen layout preset is taken as it is, even where it does not cover the cluster.
    chosen, note = compose_noting_fills(["model=llama3_1_8b", "cluster=gpu_h100_1x8", "layout=dp2_zero2"])
    assert (chosen.layout.dp_shard, chosen.layout.seq_len, chosen.layout.micro_batch) == (2, 64, 2) and note is None


def test_a_given_replicate_degree_takes_the_world_the_open_shard_stays_one():
    run = compose_run_config(["model=llama3_1_8b", "cluster=gpu_h100_1x8", "layout.dp_replicate=-1"])
    assert (run.layout.dp_replicate, run.layout.dp_shard, run.layout.name) == (8, 1, "dp1_dpr8_zero3")
    cpu = compose_run_config(["layout.dp_replicate=-1"])
    assert (cpu.layout.dp_replicate, cpu.layout.dp_shard) == (1, 2)


def test_cpu_defaults_are_the_toy_they_were():
    bare = compose_run_config([])
    assert asdict(bare.layout) == asdict(compose_run_config(["layout=dp2_zero2"]).layout)
    assert bare.layout.name == "dp2_zero2"
    # `make recipe` (recipes=cpu_zero2) chooses its layout: nothing is filled, nothing said.
    assert compose_noting_fills(["recipes=cpu_zero2"])[1] is None
    # The CPU toy's values are those of the dp2_zero2 preset, written once in each place.
    preset = yaml.safe_load((REPO_ROOT / "hydra_configs/layout/dp2_zero2.yaml").read_text())
    assert {key: preset.get(key, "none") for key in CPU_TOY} == CPU_TOY


def test_a_hub_model_on_gpus_must_give_its_length():
    with pytest.raises(DegreeFillError, match="layout.seq_len is not set and model.hub_id='org/some-model'"):
        compose_run_config(["model.hub_id=org/some-model", "cluster=gpu_h100_1x8"])
    run = compose_run_config(["model.hub_id=org/some-model", "cluster=gpu_h100_1x8", "layout.seq_len=4096"])
    assert run.layout.seq_len == 4096


@pytest.mark.parametrize("command", [["plan"], ["run", "--cfg", "job"], ["sweep", "launcher=slurm", "--dry-run"]],
                         ids=["plan", "run", "sweep"])
def test_plan_run_and_sweep_say_what_they_filled(command, tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness.cli", *command, "model=llama3_1_8b", "cluster=gpu_h100_1x8",
                          "tracking=disabled", f"results_dir={tmp_path}"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "1000"})
    assert out.returncode == 0, out.stderr
    notes = [line for line in out.stderr.splitlines() if line.startswith("[harness] layout not given")]
    assert len(notes) == 1 and "layout.seq_len=8192" in notes[0] and "layout.dp_shard=8" in notes[0]
    if command[0] == "plan":
        assert "dp8 z3 mb1x1 s8192" in out.stdout and "fits" in out.stdout
    if command[0] == "sweep":  # the run folder carries the filled layout's name
        assert [path.name for path in tmp_path.glob("adhoc/*/*-*")] == ["000-deepspeed-dp8_zero3"]


def test_a_generated_preset_name_follows_the_fields_it_spells():
    run = compose_run_config(["layout=dp2_zero2", "layout.zero_stage=3"])
    assert (run.layout.zero_stage, run.layout.name) == (3, "dp2_zero3")
    assert compose_run_config(["layout=dp2_zero2"]).layout.name == "dp2_zero2"
    named = compose_run_config(["layout=dp2_zero2", "layout.name=mine", "layout.zero_stage=3"])
    assert named.layout.name == "mine"  # a name of the user's own stays
