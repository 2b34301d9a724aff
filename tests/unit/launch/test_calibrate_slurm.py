"""`harness calibrate --slurm`: the job script it submits, read back by Slurm's own rules where they apply."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from harness.config.arguments import CommandLineError
from harness.launch.calibrate_slurm import parse, render_calibrate_script


def test_the_calibration_job_runs_one_rank_per_task_on_every_node(tmp_path):
    script = tmp_path / "cluster.calibrate.sbatch"
    text = render_calibrate_script(script, tmp_path / "cluster.json", "cluster", nodes=2, tasks_per_node=4,
                                   precision="bf16", directives=["--partition=gpu", "--time=00:20:00"],
                                   python="/venv/bin/python")
    directives = re.findall(r"^#SBATCH (\S+)$", text, re.M)
    assert directives == ["--job-name=harness-calibrate", f"--output={tmp_path / 'cluster.calibrate.out'}",
                          "--nodes=2", "--ntasks-per-node=4", "--export=ALL", "--partition=gpu", "--time=00:20:00"]
    assert "export MASTER_ADDR=" in text and "export MASTER_PORT=" in text  # the runs' own rendezvous block
    assert re.search(r"srun --kill-on-bad-exit=1 --export=ALL /venv/bin/python -m harness.runtime.calibrate "
                     r"--slurm-task \\\n\s+--precision bf16 --name cluster --out \S+cluster.json", text)
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


@pytest.mark.parametrize("argv, message", [
    (["--slurm", "--nodes", "0"], "argument --nodes: '0' must be >= 1"),
    (["--slurm", "--sbatch=--nodes=4"], "sets --nodes, which the harness writes from --nodes"),
    (["--slurm", "--sbatch=-N4"], "sets --nodes, which the harness writes from --nodes"),
    (["--slurm", "--sbatch=--ntasks-per-node=4"], "from --tasks-per-node"),
    (["--slurm", "--sbatch=--output=x"], "sets --output, which the harness writes itself"),
    (["--slurm", "--sbatch=--mem=4G --time=9"], "must be one sbatch option"),
    (["--slurm", "--name", "../../x"], "argument --name: '../../x' must be a name"),
])
def test_bad_options_are_refused_before_anything_is_submitted(argv, message):
    with pytest.raises(CommandLineError) as error:
        parse(argv)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_out_path_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(CommandLineError, match="its folder .*file is a file"):
        parse(["--slurm", "--out", str(tmp_path / "file" / "p.json")])


def test_a_partition_is_still_the_users_to_give():
    assert parse(["--slurm", "--sbatch=--partition=gpu"]).sbatch == ["--partition=gpu"]


def test_the_cli_routes_slurm_calibration_without_torch():
    code = ("import sys; from harness.cli import calibrate_command; import harness.launch.calibrate_slurm; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
