"""engine.launcher=deepspeed: one node only, and the program's own arguments reach bench unchanged."""

from __future__ import annotations

import pytest

from harness.config.compose import compose_run_config
from harness.config.errors import explain
from harness.engines import engine_module


def test_the_runner_passes_the_run_directory_as_the_first_argument(tmp_path):
    from deepspeed.launcher.runner import parse_args

    cfg = compose_run_config(["engine.launcher=deepspeed", "tracking=disabled"])
    rendered = engine_module(cfg.engine.name).render(cfg, tmp_path)
    args = parse_args(rendered.argv_for("0", "127.0.0.1", "29500")[1:])
    # Without --no_local_rank deepspeed.launcher.launch puts `--local_rank=N` before the run directory.
    assert args.no_local_rank and args.module and args.no_ssh
    assert (args.user_script, args.user_args) == ("harness.runtime.bench", [str(tmp_path)])


@pytest.mark.parametrize("overrides,where", [
    (["launcher=slurm"], "launcher.backend=slurm"),
    (["launcher=slurm_gpu", "cluster=h100_8x8", "layout.dp_shard=64"], "launcher.backend=slurm"),
    (["cluster.nodes=2", "cluster.accelerators_per_node=1"], "cluster.nodes=2"),
])
def test_deepspeed_launcher_is_refused_beyond_one_local_node(overrides, where):
    with pytest.raises(Exception) as refused:
        compose_run_config(["engine.launcher=deepspeed", *overrides])
    line = explain(refused.value)
    assert line.startswith(f"engine.launcher='deepspeed' cannot start the ranks with {where}")
    assert "use engine.launcher=torchrun" in line


def test_torchrun_under_slurm_is_the_working_alternative():
    assert compose_run_config(["engine.launcher=torchrun", "launcher=slurm"]).engine.launcher == "torchrun"
