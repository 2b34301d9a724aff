"""tools/run_tests.sh (`make test`) with a stand-in for pytest: all three parts run with their selections (the
multi-process runs spread over processes, the faults one at a time after them), the Slurm part's output comes
after the others', any failing part fails the whole, and an interrupted unit part starts nothing more."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness import REPO_ROOT

SCRIPT = REPO_ROOT / "tools" / "run_tests.sh"
# Records its part (the marker expression, "unit" or "faults") and its arguments, then exits with the code
# FAKE_EXIT names for its part; FAKE_SLEEP makes a part wait for an interrupt, which pytest answers with exit 2
# from the moment its session starts: here, before the part is recorded as started.
FAKE_PYTEST = f"""#!{sys.executable}
import json, os, sys, time
try:
    args = sys.argv[1:]
    part = next((name for name in ("unit", "faults") if "tests/" + name in args), None) \\
        or args[args.index("-m", 1) + 1]
    with open(os.environ["FAKE_LOG"] + ".args", "a") as log:
        log.write(json.dumps([part, args]) + "\\n")
    print("output of", part, flush=True)
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(part + "\\n")
    time.sleep(float(os.environ.get("FAKE_SLEEP_" + part.replace(" ", "_"), "0")))
except KeyboardInterrupt:
    sys.exit(2)
sys.exit(int(os.environ.get("FAKE_EXIT_" + part.replace(" ", "_"), "0")))
"""


@pytest.fixture
def fake(tmp_path):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTEST)
    python.chmod(0o755)
    env = {**os.environ, "PY": str(python), "FAKE_LOG": str(tmp_path / "parts.log"), "TEST_WORKERS": "3"}
    return env, tmp_path / "parts.log"


def _own_group_with_default_sigint():
    """As a terminal's foreground job: its own process group, SIGINT at its default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()


def _started(log: Path) -> list:
    """The parts started so far, in order."""
    return log.read_text().split("\n")[:-1] if log.exists() else []


def _wait_until_started(log: Path, parts: int) -> None:
    deadline = time.monotonic() + 20
    while len(_started(log)) < parts:
        assert time.monotonic() < deadline, f"only {_started(log)} started"
        time.sleep(0.05)


def _run(env, **extra):
    return subprocess.run([str(SCRIPT)], cwd=REPO_ROOT, env={**env, **extra}, capture_output=True, text=True,
                          timeout=60)


def test_every_part_runs_and_the_slurm_output_follows_the_others(fake):
    env, log = fake
    proc = _run(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(_started(log)) == ["faults", "not slurm", "slurm", "unit"]
    out = proc.stdout
    assert out.index("output of unit") < out.index("output of not slurm") < out.index("output of faults") \
        < out.index("output of slurm")
    assert "unit tests exit 0, Slurm tests exit 0, the others exit 0" in out


def test_the_runs_spread_over_the_workers_a_file_each_and_the_faults_run_one_at_a_time(fake):
    env, log = fake
    assert _run(env).returncode == 0
    args = dict(json.loads(line) for line in Path(f"{log}.args").read_text().splitlines())
    runs = args["not slurm"]
    assert runs[:runs.index("-m", 1)] == ["-m", "pytest", "-q", "-n", "3", "--dist", "loadfile"]
    assert "--ignore=tests/faults" in runs and "--ignore=tests/unit" in runs
    assert "-n" not in args["faults"] and args["faults"][-1] == "tests/faults"
    assert "-n" not in args["slurm"]


@pytest.mark.parametrize("part", ["unit", "slurm", "not_slurm", "faults"])
def test_one_failing_part_fails_the_whole_and_the_others_still_run(fake, part):
    env, log = fake
    proc = _run(env, **{f"FAKE_EXIT_{part}": "1"})
    assert proc.returncode != 0
    assert len(_started(log)) == 4


def test_an_interrupted_unit_part_starts_nothing_more(fake):
    env, log = fake

    proc = subprocess.Popen([str(SCRIPT)], cwd=REPO_ROOT, env={**env, "FAKE_SLEEP_unit": "30"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_own_group_with_default_sigint)
    _wait_until_started(log, 1)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
    assert proc.wait(timeout=20) == 130
    assert _started(log) == ["unit"]


def test_an_interrupt_beside_the_slurm_part_stops_it_too(fake):
    env, log = fake
    slow = {"FAKE_SLEEP_slurm": "30", "FAKE_SLEEP_not_slurm": "30"}
    proc = subprocess.Popen([str(SCRIPT)], cwd=REPO_ROOT, env={**env, **slow}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=_own_group_with_default_sigint)
    _wait_until_started(log, 3)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=20) == 130
    left = [p for p in psutil.process_iter(["cmdline"]) if str(env["PY"]) in " ".join(p.info["cmdline"] or [])]
    assert left == []
