"""`harness doctor`: PASS / WARN per line, GPU names matched to the peak table, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness import REPO_ROOT
from harness.doctor import PASS, WARN, Fact, accelerator_key, gather, pinned_versions, slurm_facts, wandb_facts
from harness.plan.peak import PEAK_FLOPS


# Names as torch.cuda.get_device_name() / nvidia-smi report them.
@pytest.mark.parametrize("name, key", [
    ("NVIDIA A100-SXM4-80GB", "a100_sxm"), ("NVIDIA A100-SXM4-40GB", "a100_sxm_40gb"),
    ("NVIDIA A100 80GB PCIe", "a100_pcie"), ("NVIDIA H100 80GB HBM3", "h100_sxm"), ("NVIDIA H100 PCIe", "h100_pcie"),
    ("NVIDIA H100 NVL", "h100_nvl"), ("NVIDIA H200", "h200"), ("NVIDIA B200", "b200"), ("NVIDIA L40S", "l40s"),
    ("AMD Instinct MI300X", "mi300x"), ("NVIDIA GeForce RTX 4090", None),
])
def test_gpu_names_map_to_the_peak_table(name, key):
    assert accelerator_key(name) == key
    assert key is None or key in PEAK_FLOPS


def test_a_failing_check_is_one_warn_line():
    def broken():
        raise ImportError("no module named deepspeed.ops\nmore")

    facts = gather((("ok", lambda: [Fact(PASS, "x", "fine")]), ("deepspeed", broken)))
    assert facts == [Fact(PASS, "x", "fine"), Fact(WARN, "deepspeed", "check failed: ImportError: no module named deepspeed.ops")]


def test_wandb_login_reads_only_the_environment():
    assert [f.status for f in wandb_facts({})] == [PASS, WARN]
    facts = wandb_facts({"WANDB_MODE": "online", "WANDB_API_KEY": "x" * 40})
    assert facts[0].detail == "online" and facts[1].status == PASS and "x" * 40 not in facts[1].detail


def test_slurm_unreachable_is_a_warning(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    (fact,) = slurm_facts()
    assert fact.status == WARN and "sinfo not found" in fact.detail


def test_pins_come_from_constraints():
    assert pinned_versions()["wandb"]


def test_doctor_prints_one_screen_of_pass_and_warn():
    out = subprocess.run([sys.executable, "-m", "harness.cli", "doctor"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "COLUMNS": "140"})
    assert out.returncode == 0 and "Traceback" not in out.stdout + out.stderr, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) <= 40
    facts = [line for line in lines if line.startswith((PASS, WARN))]
    names = " ".join(line.split()[1] for line in facts)
    for expected in ("python", "torch", "deepspeed", "gloo", "cuda", "slurm", "wandb"):
        assert expected in names
    passed, warned = (int(n) for n in lines[-1].replace(",", "").split()[::2])
    assert lines[-1].endswith("warn") and len(facts) == passed + warned
    # a long detail continues, wrapped, under itself
    assert all(line.startswith(" ") for line in lines[:-1] if not line.startswith((PASS, WARN)))
