"""launcher.nccl_*: NCCL_DEBUG / NCCL_SOCKET_IFNAME / NCCL_IB_HCA exported by job.sbatch only when set, checked."""

from __future__ import annotations

import os
import subprocess

import pytest

from harness.config.compose import compose_run_config
from harness.config.errors import explain
from harness.engines import engine_module
from harness.launch.sbatch import render_job_script

GPU = ["cluster=h100_8x8", "launcher=slurm_gpu", "layout.dp_shard=64", "layout.zero_stage=3", "tracking=disabled"]


def job_script(overrides, tmp_path) -> str:
    cfg = compose_run_config([*GPU, *overrides])
    return render_job_script(cfg, engine_module(cfg.engine.name).render(cfg, tmp_path))


def test_set_hints_are_exported(tmp_path):
    text = job_script(["launcher.nccl_debug=INFO", "launcher.nccl_socket_ifname='^lo,docker'",
                       "launcher.nccl_ib_hca='=mlx5_0:1,mlx5_1:1'"], tmp_path)
    exports = "\n".join(line for line in text.splitlines() if line.startswith("export NCCL_"))
    shown = subprocess.run(["bash", "-c", exports + '\nprintf "%s|" "$NCCL_DEBUG" "$NCCL_SOCKET_IFNAME" "$NCCL_IB_HCA"'],
                           env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, check=True).stdout
    assert shown == "INFO|^lo,docker|=mlx5_0:1,mlx5_1:1|"
    assert text.index("export NCCL_DEBUG") < text.index("\nsrun ")


def test_unset_hints_leave_nccl_its_own_choice(tmp_path):
    assert "NCCL_" not in job_script([], tmp_path)


@pytest.mark.parametrize("override,line", [
    ("launcher.nccl_debug=LOUD", "launcher.nccl_debug='LOUD' must be one of VERSION, WARN, INFO, TRACE"),
    ("launcher.nccl_socket_ifname='eth0;reboot'", "launcher.nccl_socket_ifname='eth0;reboot' must be a comma"),
    ("launcher.nccl_ib_hca='mlx5_0 $(id)'", "launcher.nccl_ib_hca='mlx5_0 $(id)' must be a comma"),
    ("launcher.nccl_socket_ifname='ib0,'", "launcher.nccl_socket_ifname='ib0,' must be a comma"),
])
def test_bad_hints_are_refused_by_field(override, line):
    with pytest.raises(Exception) as refused:
        compose_run_config([*GPU, override])
    assert explain(refused.value).startswith(line)
