"""`harness calibrate --slurm`: the job script it submits, read back by Slurm's own rules where they apply."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

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
    (["--slurm", "--nodes", "0"], "--nodes=0 must be >= 1"),
    (["--slurm", "--sbatch=--nodes=4"], "sets the job's shape"),
    (["--slurm", "--sbatch=--output=x"], "sets --output, which the harness writes itself"),
    (["--slurm", "--sbatch=--mem 4G"], "must be one sbatch option"),
])
def test_bad_options_are_refused_before_anything_is_submitted(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_cli_routes_slurm_calibration_without_torch():
    code = ("import sys; from harness.cli import calibrate_command; import harness.launch.calibrate_slurm; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
