"""A real local Slurm cluster for the tests in this directory.

``slurm_cluster`` (session scope) runs ``slurm/local/up.sh`` once, yields the environment to run Slurm
commands with (``SLURM_CONF`` points at the cluster's own config; nothing under /etc is used), and
runs ``slurm/local/down.sh`` when the session ends. The tests are skipped, with the reason, only when
Slurm's Debian packages are missing and cannot be installed (up.sh exits 3: no apt, not root, apt
failed); any other start-up failure is an error that shows the daemons' log tails.

A cluster that was already running before the session (``make slurm-up``) is used and left running;
``SLURM_LOCAL_KEEP=1`` keeps a cluster the session started. ``SLURM_LOCAL_DIR`` and the other
``SLURM_LOCAL_*`` variables of up.sh are honoured.

``slurm_cli`` wraps the commands the tests need: submit, wait for a final state, and read that state
back the two ways the harness can (``squeue --json``, which keeps finished jobs for MinJobAge, and
``sacct -c``, which reads the jobcomp/filetxt file).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UP = REPO / "slurm" / "local" / "up.sh"
DOWN = REPO / "slurm" / "local" / "down.sh"
EXIT_NOT_INSTALLABLE = 3  # up.sh: Slurm/munge missing and not installable

# Job states after which a job never changes again (22.05 names, as squeue --json / sacct -c print them).
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


def _state_dir() -> Path:
    return Path(os.environ.get("SLURM_LOCAL_DIR", "/tmp/harness-slurm"))


def _already_running(state_dir: Path) -> bool:
    pid_file = state_dir / "run" / "slurmctld.pid"
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    try:
        return b"slurmctld" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.fixture(scope="session")
def slurm_cluster():
    """Start the local cluster (or reuse a running one); yield the env dict for Slurm commands."""
    if shutil.which("bash") is None:
        pytest.skip("no bash: cannot run slurm/local/up.sh")
    state_dir = _state_dir()
    was_running = _already_running(state_dir)
    env = dict(os.environ)
    # An outer allocation's variables would confuse sbatch/srun run by the tests.
    for k in [k for k in env if k.startswith(("SLURM_JOB", "SLURM_STEP", "SLURM_NODELIST"))]:
        del env[k]
    proc = subprocess.run(
        ["bash", str(UP)], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    if proc.returncode == EXIT_NOT_INSTALLABLE:
        pytest.skip(f"Slurm is not installed and cannot be installed here: {proc.stderr.strip()[-500:]}")
    if proc.returncode != 0:
        pytest.fail(
            f"slurm/local/up.sh failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}",
            pytrace=False,
        )
    exports = dict(
        line.removeprefix("export ").split("=", 1)
        for line in proc.stdout.splitlines()
        if line.startswith("export ")
    )
    assert "SLURM_CONF" in exports, f"up.sh printed no SLURM_CONF:\n{proc.stdout}"
    env.update(exports)
    env["SLURM_LOCAL_DIR"] = str(state_dir)
    try:
        yield env
    finally:
        if not was_running and os.environ.get("SLURM_LOCAL_KEEP") != "1":
            down = subprocess.run(
                ["bash", str(DOWN)], env=env, capture_output=True, text=True, timeout=120, check=False
            )
            if down.returncode != 0:
                print(f"slurm/local/down.sh failed (exit {down.returncode}):\n{down.stderr}")


class SlurmCLI:
    """Thin wrapper over the Slurm client commands, bound to the local cluster's environment."""

    def __init__(self, env: dict[str, str]):
        self.env = env

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def sbatch(self, *args: str) -> int:
        """Submit with ``sbatch --parsable``; return the job id."""
        out = self.run("sbatch", "--parsable", *args).stdout.strip()
        return int(out.split(";")[0])  # "<id>" or "<id>;<cluster>"

    def jobs(self) -> list[dict]:
        """Every job slurmctld still knows, finished ones included (squeue --json ignores -j/-t in 22.05)."""
        return json.loads(self.run("squeue", "--json").stdout)["jobs"]

    def job(self, job_id: int) -> dict | None:
        return next((j for j in self.jobs() if j["job_id"] == job_id), None)

    def wait_state(self, job_id: int, states=FINAL_STATES, timeout: float = 120) -> dict:
        """Poll squeue --json until the job is in one of ``states``; return its record."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.job(job_id)
            if last is not None and last["job_state"] in states:
                return last
            time.sleep(0.5)
        state = None if last is None else (last["job_state"], last["state_reason"])
        raise AssertionError(f"job {job_id} not in {sorted(states)} after {timeout}s (last: {state})")

    def sacct_c(self, job_id: int, timeout: float = 30) -> dict[str, str]:
        """The job's record in the jobcomp file, via ``sacct -c`` (JobID is the raw id, also for arrays)."""
        fields = ["JobID", "JobName", "State", "ExitCode", "DerivedExitCode", "NodeList", "Start", "End"]
        deadline = time.monotonic() + timeout
        while True:
            out = self.run(
                "sacct", "-c", "-n", "-P", "-S", "2000-01-01", "-j", str(job_id), "-o", ",".join(fields)
            ).stdout
            rows = [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line.strip()]
            rows = [r for r in rows if r["JobID"] == str(job_id)]
            if rows:
                return rows[-1]
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} not in `sacct -c` after {timeout}s")
            time.sleep(0.5)


@pytest.fixture(scope="session")
def slurm_cli(slurm_cluster) -> SlurmCLI:
    return SlurmCLI(slurm_cluster)
