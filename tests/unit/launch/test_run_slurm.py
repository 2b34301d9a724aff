"""`harness run` with a Slurm backend, Slurm's commands faked at their one module (slurm_commands): the
run is submitted through its job.sbatch (never refused as "launcher=local starts one node", never run
here), its job id and run directory printed, followed to the end, and scancelled on Ctrl-C."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.launch import slurm_commands

JOB = "4242"
TWO_NODES = ["launcher=slurm", "cluster.nodes=2", "cluster.accelerators_per_node=1", "tracking=disabled",
             "bench.steps=2", "sweep_name=slurmrun"]


class FakeSlurm:
    """sbatch answers JOB; squeue answers the queued states in turn (the last one repeats)."""

    def __init__(self, states=("PENDING",), interrupt=False):
        self.calls, self.states, self.interrupt = [], list(states), interrupt

    def __call__(self, argv, timeout=60):
        self.calls.append(list(argv))
        if argv[0] == "sbatch":
            return f"{JOB}\n"
        if argv[0] == "squeue":
            if self.interrupt:
                raise KeyboardInterrupt
            state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            return json.dumps({"jobs": [{"job_id": int(JOB), "job_state": state, "state_reason": "None",
                                         "exit_code": 256 if state == "FAILED" else 0}]})
        return ""

    def ran(self, command):
        return [call for call in self.calls if call[0] == command]


def harness_run(monkeypatch, fake, *args):
    monkeypatch.setattr(slurm_commands, "slurm_command", fake)
    monkeypatch.setattr(slurm_commands.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(cli, "_run_options", {"wait": True, "poll_s": None})
    monkeypatch.setattr(cli, "_failed_runs", [])
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    return cli.run_command(list(args))


def the_run(results: Path) -> Path:
    (status,) = results.glob("slurmrun/*/*/status.json")
    return status.parent


def test_a_two_node_run_is_submitted_not_refused(tmp_path, monkeypatch, capsys):
    fake = FakeSlurm()
    code = harness_run(monkeypatch, fake, *TWO_NODES, f"results_dir={tmp_path}", "--no-wait")
    out = capsys.readouterr()
    assert code == 0, out
    assert "starts one node" not in out.out + out.err
    run = the_run(tmp_path)
    assert fake.ran("sbatch") == [["sbatch", "--parsable", str(run / "job.sbatch")]]
    assert f"slurm job {JOB}; run directory {run}" in out.out
    assert f"harness sweep status --watch {run.parent}" in out.out
    script = (run / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "srun --nodes=2" in script
    assert json.loads((run / "slurm.json").read_text())["job_key"] == JOB
    sweep = json.loads((run.parent / "sweep.json").read_text())
    assert sweep["launcher"] == "slurm" and [p["run"] for p in sweep["points"]] == [run.name]
    assert not (run / "launch.log").exists()  # nothing ran on this machine


def test_a_slurm_run_is_followed_to_its_end_and_summarised(tmp_path, monkeypatch, capsys):
    fake = FakeSlurm(states=("PENDING", "RUNNING", "FAILED"))
    code = harness_run(monkeypatch, fake, *TWO_NODES, f"results_dir={tmp_path}", "--poll=0.01")
    out = capsys.readouterr().out
    run = the_run(tmp_path)
    assert code == 1
    assert len(fake.ran("squeue")) >= 3
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "FAILED" and JOB in status["reason"]
    assert "PENDING" in out and "RUNNING" in out and f"{run.name}: FAILED" in out
    assert (run.parent / "summary.csv").exists() and (run.parent / "report.html").exists()


def test_ctrl_c_cancels_the_job(tmp_path, monkeypatch, capsys):
    fake = FakeSlurm(interrupt=True)
    code = harness_run(monkeypatch, fake, *TWO_NODES, f"results_dir={tmp_path}", "--poll=0.01")
    run = the_run(tmp_path)
    assert code == cli.INTERRUPTED
    assert fake.ran("scancel") == [["scancel", JOB]]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "CANCELLED" and "scancel" in status["reason"]
    assert (run.parent / "summary.csv").exists()


def test_run_options_leave_hydra_its_arguments():
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(cli, "_run_options", {"wait": True, "poll_s": None})
    assert cli._take_run_options(["--no-wait", "a=1", "--poll=3", "--cfg", "job"]) == ["a=1", "--cfg", "job"]
    assert cli._run_options == {"wait": False, "poll_s": 3.0}
    monkeypatch.undo()
