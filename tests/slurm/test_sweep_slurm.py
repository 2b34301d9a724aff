"""`harness sweep` on the real local Slurm cluster: a grid as one job array, a 2-node run, a run that
fails on purpose and is resumed, a cancelled run, a run over its memory, metrics like a local run's.

Every sweep is submitted at once at the start (`--no-wait`) so that Slurm runs them side by side; each
test then follows its own sweep with `harness sweep status --watch`. Tiny Llama, 2 timed steps, CPU.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
COMMON = ["cluster=local_slurm", "launcher=slurm_local", "tracking=disabled", "bench.steps=2", "--no-wait"]
ONE_RANK = ["layout=single", "cluster.accelerators_per_node=1"]
# Data that is not there yet: the run fails (FileNotFoundError on the rank) until it is staged.
LATE = "late.txt"


def harness(env, *args, timeout=900, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"harness {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def submitted_dir(proc: subprocess.CompletedProcess) -> Path:
    match = re.search(r"harness sweep status --watch (\S+)`", proc.stdout)
    assert match, proc.stdout + proc.stderr
    return Path(match.group(1))


def run_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(p.parent for p in sweep_dir.glob("*/status.json"))


def state(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def watch(env, sweep_dir: Path, timeout=900) -> dict[str, dict]:
    """`harness sweep status --watch` until every job is settled; the runs' status files by name."""
    harness(env, "sweep", "status", str(sweep_dir), "--watch", "--poll=1", timeout=timeout)
    return {run.name: state(run) for run in run_dirs(sweep_dir)}


def form_differences(a, b, where="metrics"):
    """Where two JSON documents differ in form: dict keys all the way down; lists by their first elements where
    both have one (a list that is empty in one run, such as the outlying steps or the host's busy processes, holds
    data, not form)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) ^ set(b))
        return [f"{where}.{key} in one only" for key in keys] + [
            diff for key in sorted(set(a) & set(b)) for diff in form_differences(a[key], b[key], f"{where}.{key}")]
    if isinstance(a, list) and isinstance(b, list):
        return form_differences(a[0], b[0], f"{where}[0]") if a and b else []
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return [f"{where}: {type(a).__name__} vs {type(b).__name__}"]
    return []


def digest(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    (folder / "ok.txt").write_text("\n".join(" ".join(words[(i * j) % 5] for j in range(40)) for i in range(100)))
    return folder


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict:
    return dict(slurm_cluster)


@pytest.fixture(scope="module")
def sweeps(env, data_dir, tmp_path_factory) -> dict:
    """Submit every sweep of this module at once (in parallel: each `harness sweep` spends its first
    seconds importing); start the local reference run beside them."""
    results = tmp_path_factory.mktemp("results")
    common = [*COMMON, f"results_dir={results}"]
    data = f"data.path={data_dir / 'ok.txt'},{data_dir / LATE}"
    commands = {
        # runs until cancelled: no time limit, which a million steps would exceed (harness/plan/time_limit.py)
        "cancel": [*common, *ONE_RANK, "sweep_name=cancel", "bench.steps=1000000", "bench.seed=0,1",
                   "launcher.time_limit=UNLIMITED"],
        "memory": [*common, *ONE_RANK, "sweep_name=memory", 'launcher.extra_sbatch=["--mem=250M"]'],
        # torchrun (deepspeed) and accelerate launch (fsdp), each one process per node on two nodes.
        "two_node": [*common, "sweep_name=two_node", "cluster.nodes=2", "cluster.accelerators_per_node=1",
                     "engine=deepspeed,fsdp"],
        "resume": [*common, *ONE_RANK, "sweep_name=resume", "data=text", data],
        "grid": ["sweep=cpu_grid", *common, "engine=deepspeed,fsdp", "layout.zero_stage=2,3",
                 "launcher.array_concurrency=2"],
    }
    # The late point's data passes the checks before submission and is gone when its job reads it (the
    # file is removed as soon as the sweep is submitted, seconds before a rank has imported torch).
    (data_dir / LATE).write_text((data_dir / "ok.txt").read_text())
    procs = {name: subprocess.Popen([sys.executable, "-m", "harness.cli", "sweep", *args], cwd=REPO, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, args in commands.items()}
    submitted = {}
    for name in ["resume", *[name for name in procs if name != "resume"]]:
        proc = procs[name]
        out, err = proc.communicate(timeout=600)
        if name == "resume":
            (data_dir / LATE).unlink()
        assert proc.returncode == 0, f"harness sweep {commands[name]}: {proc.returncode}\n{out}\n{err}"
        submitted[name] = submitted_dir(subprocess.CompletedProcess(proc.args, 0, out, err))
    # The same point as the resume sweep's first run, launched on this machine without Slurm.
    local_args = [sys.executable, "-m", "harness.cli", "sweep", *[a for a in common if a != "--no-wait"],
                  *ONE_RANK, "launcher=local", "sweep_name=local_ref", "data=text",
                  f"data.path={data_dir / 'ok.txt'}"]
    log = open(results / "local_ref.log", "w")
    submitted["local"] = subprocess.Popen(local_args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    submitted["results"] = results
    yield submitted
    if submitted["local"].poll() is None:
        submitted["local"].kill()
    log.close()


def status_json(env, sweep_dir: Path) -> dict[str, dict]:
    out = harness(env, "sweep", "status", str(sweep_dir), "--json").stdout
    return {row["run"]: row for row in json.loads(out)}


def test_requeued_then_cancelled_runs(env, sweeps, slurm_cli):
    """Both runs of an array start; one is requeued (what preemption or a node failure does with
    --requeue) and shows PENDING again; `harness sweep cancel` then cancels the sweep: CANCELLED."""
    sweep_dir = sweeps["cancel"]
    runs = run_dirs(sweep_dir)
    deadline = time.monotonic() + 600
    while any(state(run)["state"] != "RUNNING" for run in runs):  # the job-start hooks ran
        assert time.monotonic() < deadline, [state(run) for run in runs]
        time.sleep(0.5)
    requeued = json.loads((runs[1] / "slurm.json").read_text())["job_key"]
    slurm_cli.run("scontrol", "requeue", requeued)
    deadline = time.monotonic() + 120
    while (row := status_json(env, sweep_dir)[runs[1].name])["state"] != "PENDING":  # via COMPLETING
        assert time.monotonic() < deadline and row["state"] == "RUNNING", row
        time.sleep(1)
    assert "requeued (1x)" in row["reason"], row
    assert status_json(env, sweep_dir)[runs[0].name]["state"] == "RUNNING"

    out = harness(env, "sweep", "cancel", str(sweep_dir)).stdout
    assert "scancel" in out
    states = watch(env, sweep_dir, timeout=300)
    assert {s["state"] for s in states.values()} == {"CANCELLED"}, states
    assert not any((run / "metrics.json").exists() for run in runs)


def test_run_over_its_memory_is_told_apart(env, sweeps, slurm_cli):
    """cgroup mode (SLURM_LOCAL_CGROUP=1): the step's SIG_OOM makes it OOM, or first the job's watchdog, which
    saw its rank SIGKILLed while the memory cgroup's oom_kill count rose (the rank's record then gives the
    reason, with the same verdict first). linuxproc mode: Slurm's RSS poller SIGKILLs it (0:9, like any SIGKILL);
    slurmstepd's line in the job's log is the evidence: OOM."""
    (run,) = run_dirs(sweeps["memory"])
    final = watch(env, sweeps["memory"], timeout=300)[run.name]
    mode = (Path(slurm_cli.env["SLURM_LOCAL_DIR"]) / "mode").read_text().strip()
    assert final["state"] == "OOM" and re.match(r"(rank 0: SIGKILL: )?out of memory \(host\)", final["reason"]), final
    if mode == "cgroup":
        assert any(word in final["reason"] for word in ("SIG_OOM", "oom-kill", "oom_kill count rose")), final
    else:
        assert "exceeded memory limit" in final["reason"], final


def test_two_node_runs(env, sweeps, slurm_cli):
    sweep_dir = sweeps["two_node"]
    states = watch(env, sweep_dir)
    assert {s["state"] for s in states.values()} == {"COMPLETED"}, states
    for run in run_dirs(sweep_dir):
        submission = json.loads((run / "slurm.json").read_text())
        record = json.loads((run / "slurm_job.json").read_text())
        assert record["nodes"] == "n[1-2]" and record["master_addr"] == "127.0.0.1"
        assert int(record["master_port"]) == 20000 + int(record["job_id"]) % 10000
        assert slurm_cli.job(int(record["job_id"]))["nodes"] == "n[1-2]"
        assert submission["array_job_id"] is not None  # the two runs share one 2-node array
        metrics = json.loads((run / "metrics.json").read_text())
        # Each node's launcher starts one process: a world of two means both nodes joined the rendezvous.
        assert metrics["world_size"] == 2 and metrics["cluster"]["nodes"] == 2
    launchers = {json.loads((run / "rendered.json").read_text())["launcher"] for run in run_dirs(sweep_dir)}
    assert launchers == {"torchrun", "accelerate"}


def test_job_sbatch_resubmitted_by_hand(env, sweeps, slurm_cli):
    """A run's job.sbatch is a complete job: `sbatch` it again and the run re-runs, followed by status."""
    sweep_dir = sweeps["two_node"]
    watch(env, sweep_dir)
    run = run_dirs(sweep_dir)[0]
    first = json.loads((run / "metrics.json").read_text())
    job_id = slurm_cli.sbatch(str(run / "job.sbatch"))
    assert slurm_cli.wait_state(job_id, timeout=600)["job_state"] == "COMPLETED"
    states = watch(env, sweep_dir)
    assert states[run.name]["state"] == "COMPLETED"
    assert json.loads((run / "slurm_job.json").read_text())["job_id"] == str(job_id)
    assert (run / f"slurm-{job_id}.out").exists()
    assert json.loads((run / "attempts" / "1" / "metrics.json").read_text()) == first  # set aside, not lost
    assert json.loads((run / "metrics.json").read_text())["world_size"] == 2


def test_grid_runs_as_one_array(env, sweeps, slurm_cli):
    sweep_dir = sweeps["grid"]
    states = watch(env, sweep_dir)
    assert len(states) == 4
    assert {s["state"] for s in states.values()} == {"COMPLETED"}, states
    submissions = [json.loads((run / "slurm.json").read_text()) for run in run_dirs(sweep_dir)]
    array_ids = {s["array_job_id"] for s in submissions}
    assert len(array_ids) == 1 and sorted(s["array_task_id"] for s in submissions) == [0, 1, 2, 3]
    array_id = array_ids.pop()
    tasks = [j for j in slurm_cli.jobs() if str(j["array_job_id"]) == array_id]
    assert len(tasks) == 4 and {j["array_max_tasks"] for j in tasks} == {2}
    with open(sweep_dir / "summary.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((r["engine"], r["zero_stage"], r["status"]) for r in rows) == [
        ("deepspeed", "2", "COMPLETED"), ("deepspeed", "3", "COMPLETED"),
        ("fsdp", "2", "COMPLETED"), ("fsdp", "3", "COMPLETED")]
    assert all(float(r["tokens_per_s"]) > 0 for r in rows)


def test_failed_point_then_resume_resubmits_only_it(env, sweeps, data_dir):
    sweep_dir = sweeps["resume"]
    ok, late = run_dirs(sweep_dir)
    states = watch(env, sweep_dir)
    assert states[ok.name]["state"] == "COMPLETED", states
    reason = states[late.name]["reason"]
    assert states[late.name]["state"] == "FAILED" and f"{LATE}' does not exist" in reason, states
    assert (late / "errors").is_dir() and not (ok / "errors").exists()
    before = digest(ok)

    (data_dir / LATE).write_text((data_dir / "ok.txt").read_text())  # the data arrives
    out = harness(env, "sweep", "resume", str(sweep_dir), "--poll=1").stdout
    assert f"resume {late.name} (was FAILED)" in out and f"resume {ok.name}" not in out
    assert state(ok)["state"] == state(late)["state"] == "COMPLETED"
    assert digest(ok) == before  # the completed run's files were not touched
    history = json.loads((late / "slurm.json").read_text())
    assert history["attempt"] == 2 and history["history"][0]["state"] == "FAILED"
    assert (late / "attempts" / "1" / "errors").is_dir() and not (late / "errors").exists()
    assert json.loads((ok / "slurm.json").read_text())["attempt"] == 1
    with open(sweep_dir / "summary.csv") as handle:
        assert {r["status"] for r in csv.DictReader(handle)} == {"COMPLETED"}


def test_metrics_have_the_form_of_a_local_runs(env, sweeps):
    local = sweeps["local"]
    local.wait(timeout=900)
    assert local.returncode == 0, (sweeps["results"] / "local_ref.log").read_text()
    (local_run,) = run_dirs(next((sweeps["results"] / "local_ref").iterdir()))
    slurm_run = run_dirs(sweeps["resume"])[0]
    watch(env, sweeps["resume"])
    local_metrics = json.loads((local_run / "metrics.json").read_text())
    slurm_metrics = json.loads((slurm_run / "metrics.json").read_text())
    assert form_differences(slurm_metrics, local_metrics) == []
    assert slurm_metrics["layout"] == local_metrics["layout"] and slurm_metrics["world_size"] == 1
