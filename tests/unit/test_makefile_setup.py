"""`make setup` says which stage it is in and drops pip's "Location ... is ignored" lines, nothing else."""

import shutil
import subprocess
import sys

import pytest

from harness import REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def setup_lines(tmp_path, **variables):
    """The recipe lines `make setup` would run for a venv in tmp_path (printed, not run: the real venv stays)."""
    args = [f"{key}={value}" for key, value in {"VENV": tmp_path / "venv", **variables}.items()]
    out = subprocess.run(["make", "-n", "-B", "setup", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout.splitlines()


def test_each_install_stage_is_announced(tmp_path):
    lines = setup_lines(tmp_path)
    stages = [line for line in lines if line.startswith('echo "[setup ')]
    assert [line.split("]")[0] for line in stages] == ['echo "[setup 1/3', 'echo "[setup 2/3', 'echo "[setup 3/3']
    # Each announcement comes before the command it announces.
    commands = [line for line in lines if "venv" in line and not line.startswith("echo")]
    assert lines.index(stages[0]) < lines.index(commands[0])
    pips = [line for line in lines if " -m pip " in line]
    assert len(pips) == 2 and all(lines.index(stage) < lines.index(pip) for stage, pip in zip(stages[1:], pips))


def test_pip_lines_drop_ignored_location_warnings_and_keep_failures(tmp_path):
    """The torch stage's own line, run as a `pip download` of a small package from this machine's indexes."""
    def run_torch_line(spec):
        line = next(line for line in setup_lines(tmp_path, TORCH_SPEC=spec, PY=sys.executable) if " -m pip " in line)
        line = line.replace(" install -q ", f" download -q --no-deps -d {tmp_path / 'wheels'} ")
        return subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120)

    found = run_torch_line("six")
    assert found.returncode == 0, found.stdout + found.stderr
    assert "is ignored" not in found.stdout + found.stderr
    missing = run_torch_line("no-such-package-of-this-name")
    assert missing.returncode != 0 and "no-such-package-of-this-name" in missing.stdout + missing.stderr
