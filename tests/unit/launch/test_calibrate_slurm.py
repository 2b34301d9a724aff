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


def _measured(name="local-slurm"):
    from dataclasses import replace

    from harness.plan.hardware import HARDWARE, PROFILE_VERSION

    return replace(HARDWARE["h100_sxm"], name=name, source=f"measured:{name}", version=PROFILE_VERSION)


def _submit_then(monkeypatch, outcome):
    from harness.launch import calibrate_slurm
    from harness.launch.slurm_commands import SlurmError

    def fake_sbatch(argv, timeout):
        outcome()
        raise SlurmError("sbatch --parsable --wait x.sbatch exited 143: ")

    monkeypatch.setattr(calibrate_slurm, "slurm_command", fake_sbatch)
    return calibrate_slurm


def test_a_job_ended_by_a_peers_teardown_keeps_the_profile_it_wrote(monkeypatch, tmp_path, capsys):
    """Rank 0 writes the profile before the gloo group's teardown; a peer aborting there (pytorch/gloo#168) makes
    srun --kill-on-bad-exit fail the job, and the profile it wrote is still the calibration's result."""
    from harness.plan.hardware import save_profile

    out = tmp_path / "local-slurm.json"
    save_profile(_measured("earlier"), out)  # an earlier calibration's profile, replaced by the job's
    calibrate_slurm = _submit_then(monkeypatch, lambda: save_profile(_measured(), out))
    assert calibrate_slurm.main(["--slurm", "--out", str(out)]) == 0
    assert "exited 143 after it wrote the profile; it is kept" in capsys.readouterr().err


def test_a_failed_job_never_passes_off_an_earlier_profile_as_its_own(monkeypatch, tmp_path, capsys):
    from harness.plan.hardware import save_profile

    out = tmp_path / "local-slurm.json"
    save_profile(_measured("earlier"), out)
    calibrate_slurm = _submit_then(monkeypatch, lambda: None)
    assert calibrate_slurm.main(["--slurm", "--out", str(out)]) == 1
    assert "[harness] calibration job failed: sbatch --parsable --wait x.sbatch exited 143" in capsys.readouterr().err


def test_rank_zero_writes_the_profile_before_the_group_is_torn_down(monkeypatch, tmp_path):
    """What rank 0 keeps is written inside the group (`keep`), so a death in the teardown after it loses nothing."""
    from harness.plan.hardware import load_profile
    from harness.runtime import calibrate
    from tests.unit.runtime.test_calibrate import record

    def group_that_dies_in_teardown(rank, world, init_method, precision, keep=lambda records: None):
        keep([record(), record()])
        raise RuntimeError("Connection reset by peer")

    monkeypatch.setattr(calibrate, "_measure_in_group", group_that_dies_in_teardown)
    monkeypatch.setattr(calibrate, "disk_bandwidth", lambda directory: 1e9)
    for key, value in {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "cluster.json"
    with pytest.raises(RuntimeError, match="Connection reset"):
        calibrate.slurm_task("bf16", "cluster", str(out))
    profile = load_profile(out)
    assert profile is not None and profile.name == "cluster" and profile.gpus_per_node == 1
