"""The local two-node Slurm cluster (slurm/local/up.sh) behaves like the real thing the launcher needs.

Final states are read back the two ways the harness's status tracking can use:
- ``squeue --json``: ``job_state`` (string), ``state_reason``, ``exit_code`` = the raw wait status
  (exit status << 8 | signal), ``derived_exit_code`` (same encoding, highest of the steps),
  ``array_job_id`` / ``array_task_id``; finished jobs stay listed for MinJobAge (one day here).
- ``sacct -c``: the jobcomp/filetxt record: ``State``, ``ExitCode`` as ``status:signal``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm


def _exit_status(raw: int) -> tuple[int, int]:
    """(exit status, signal) from the raw wait status squeue --json reports."""
    return (raw >> 8) & 0xFF, raw & 0x7F


def _nodes(slurm_cli):
    out = slurm_cli.run("sinfo", "-h", "-N", "-p", "debug", "-o", "%N|%t|%G|%c|%o").stdout
    nodes = {}
    for line in out.splitlines():
        name, state, gres, cpus, addr = line.split("|")
        nodes[name] = (state, gres, int(cpus), addr)
    return out, nodes


def test_two_idle_nodes_with_gpu_gres(slurm_cli):
    out, nodes = _nodes(slurm_cli)
    deadline = time.monotonic() + 120
    # A node still completing another test's job ("comp": slurmd ending its processes) comes back idle.
    while any(state == "comp" for state, *_ in nodes.values()) and time.monotonic() < deadline:
        time.sleep(1)
        out, nodes = _nodes(slurm_cli)
    assert sorted(nodes) == ["n1", "n2"], out
    for name, (state, gres, cpus, addr) in nodes.items():
        assert state == "idle", f"{name}: {state}\n{out}"
        assert gres.startswith("gpu:") and int(gres.split(":")[-1].split("(")[0]) >= 1, gres
        assert cpus >= 2
        # Node names do not resolve; the address to use (e.g. for a rendezvous) is NodeAddr.
        assert addr == "127.0.0.1"
        shown = slurm_cli.run("scontrol", "show", "node", name).stdout
        assert "NodeAddr=127.0.0.1" in shown and "State=IDLE" in shown, shown


def test_two_node_job_sees_two_node_ids_and_gpus(slurm_cli, tmp_path):
    script = tmp_path / "two.sbatch"
    out = tmp_path / "two.out"
    script.write_text(
        "#!/bin/bash\n"
        "set -euo pipefail\n"
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        'addr=$(scontrol show node "$first" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)\n'
        'echo "FIRST $first $addr"\n'
        "srun bash -c 'echo TASK $SLURM_PROCID $SLURM_NODEID $SLURMD_NODENAME "
        "$SLURM_JOB_NODELIST $CUDA_VISIBLE_DEVICES'\n"
    )
    job_id = slurm_cli.sbatch(
        "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:2", "--time=2",
        f"--output={out}", f"--chdir={tmp_path}", str(script),
    )  # fmt: skip
    rec = slurm_cli.wait_state(job_id)
    text = out.read_text() if out.exists() else "<no output>"
    assert rec["job_state"] == "COMPLETED", text
    assert _exit_status(rec["exit_code"]) == (0, 0)
    assert rec["nodes"] == "n[1-2]"

    tasks = [line.split()[1:] for line in text.splitlines() if line.startswith("TASK ")]
    assert len(tasks) == 2, text
    assert {t[1] for t in tasks} == {"0", "1"}, text  # SLURM_NODEID
    assert {t[2] for t in tasks} == {"n1", "n2"}, text  # SLURMD_NODENAME
    assert all(t[3] == "n[1-2]" for t in tasks), text  # SLURM_JOB_NODELIST
    assert all(t[4] == "0,1" for t in tasks), text  # CUDA_VISIBLE_DEVICES from --gres=gpu:2
    assert "FIRST n1 127.0.0.1" in text, text
    assert slurm_cli.sacct_c(job_id)["State"] == "COMPLETED"


def test_failing_job_is_failed_with_exit_code_1(slurm_cli, tmp_path):
    job_id = slurm_cli.sbatch(
        "--time=2", f"--output={tmp_path}/fail.out", f"--chdir={tmp_path}",
        "--wrap", "echo about to fail; exit 1",
    )  # fmt: skip
    rec = slurm_cli.wait_state(job_id)
    assert rec["job_state"] == "FAILED"
    assert rec["state_reason"] == "NonZeroExitCode"
    assert rec["exit_code"] == 256  # raw wait status: exit 1
    assert _exit_status(rec["exit_code"]) == (1, 0)
    acct = slurm_cli.sacct_c(job_id)
    assert (acct["State"], acct["ExitCode"]) == ("FAILED", "1:0"), acct
    assert (tmp_path / "fail.out").read_text().strip() == "about to fail"


def test_cancelled_job_is_cancelled(slurm_cli, tmp_path):
    job_id = slurm_cli.sbatch(
        "--time=5", f"--output={tmp_path}/cancel.out", f"--chdir={tmp_path}", "--wrap", "sleep 300"
    )
    slurm_cli.wait_state(job_id, states={"RUNNING"}, timeout=60)
    slurm_cli.run("scancel", str(job_id))
    rec = slurm_cli.wait_state(job_id, timeout=60)
    assert rec["job_state"] == "CANCELLED"
    assert _exit_status(rec["exit_code"]) == (0, 15)  # the batch shell got SIGTERM
    acct = slurm_cli.sacct_c(job_id)
    assert acct["State"] == "CANCELLED", acct  # jobcomp records ExitCode 0:0 for cancelled jobs


def test_job_array_with_concurrency_limit(slurm_cli, tmp_path):
    array_id = slurm_cli.sbatch(
        "--array=0-3%2", "--time=2", f"--output={tmp_path}/arr-%A_%a.out", f"--chdir={tmp_path}",
        "--wrap", "echo $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT",
    )  # fmt: skip
    recs = {}
    for _ in range(240):
        recs = {j["array_task_id"]: j for j in slurm_cli.jobs() if j["array_job_id"] == array_id}
        if len(recs) == 4 and all(j["job_state"] in {"COMPLETED", "FAILED"} for j in recs.values()):
            break
        time.sleep(0.5)
    assert sorted(recs) == [0, 1, 2, 3], recs.keys()
    assert {j["job_state"] for j in recs.values()} == {"COMPLETED"}
    assert {j["array_max_tasks"] for j in recs.values()} == {2}
    for task in range(4):
        assert (tmp_path / f"arr-{array_id}_{task}.out").read_text().split() == [
            str(array_id), str(task), "4",
        ]  # fmt: skip
    # sacct -c lists array tasks by their raw job ids, each COMPLETED.
    for rec in recs.values():
        assert slurm_cli.sacct_c(rec["job_id"])["State"] == "COMPLETED"


def test_job_over_its_memory_is_killed_and_recognisable(slurm_cli, tmp_path):
    """linuxproc mode (default): SIGKILL by RSS polling, FAILED 0:9 + message; cgroup mode: OUT_OF_MEMORY."""
    hog = tmp_path / "hog.py"
    hog.write_text(
        "import time\nblocks = []\n"
        "for i in range(60):\n"
        "    blocks.append(bytearray(50 * 1024 * 1024))\n"
        "    time.sleep(0.2)\n"
    )
    out = tmp_path / "oom.out"
    job_id = slurm_cli.sbatch(
        "--mem=150M", "--time=2", f"--output={out}", f"--chdir={tmp_path}", "--wrap", f"python3 {hog}"
    )
    rec = slurm_cli.wait_state(job_id, timeout=90)
    mode = _mode(slurm_cli)
    text = out.read_text()
    acct = slurm_cli.sacct_c(job_id)
    if mode == "cgroup":
        assert rec["job_state"] == "OUT_OF_MEMORY" and rec["state_reason"] == "OutOfMemory", rec
        assert acct["State"] == "OUT_OF_MEMORY", acct
    else:
        assert rec["job_state"] == "FAILED", rec
        assert _exit_status(rec["exit_code"]) == (0, 9), rec["exit_code"]
        assert (acct["State"], acct["ExitCode"]) == ("FAILED", "0:9"), acct
        assert "Exceeded job memory limit" in text, text


def _mode(slurm_cli) -> str:
    """linuxproc or cgroup: what up.sh chose (SLURM_LOCAL_CGROUP), recorded in the state directory."""
    return (Path(slurm_cli.env["SLURM_LOCAL_DIR"]) / "mode").read_text().strip()
