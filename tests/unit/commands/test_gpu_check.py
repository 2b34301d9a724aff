"""`make gpu-check` where there is no GPU: the skip line, the GPU stages planned without launching, and the
checks' rules (each can fail)."""

import json
import math
import os
import subprocess
import sys

import pytest

from harness import REPO_ROOT
from harness.commands import gpu_check
from harness.config.compose import compose_run_config

NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def check(args, env=NO_GPU):
    return subprocess.run([sys.executable, "-m", "harness.commands.gpu_check", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_without_a_gpu_it_skips_in_one_line_and_says_so_in_the_summary(tmp_path):
    proc = check(["--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [proc.stdout.strip()]
    assert proc.stdout.startswith("gpu-check: skipped: no CUDA device visible to torch")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["schema"] == gpu_check.SCHEMA and summary["status"] == "skipped" and summary["stages"] == []
    assert summary["versions"]["torch"]


def test_the_make_target_skips_through_its_script(tmp_path):
    env = {**NO_GPU, "PY": sys.executable, "OUT": str(tmp_path), "WHEELS": str(tmp_path / "none")}
    proc = subprocess.run(["bash", "tools/gpu_check.sh"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gpu-check: skipped:") and len(proc.stdout.splitlines()) == 1
    assert not (tmp_path / "none").exists()


def test_every_gpu_stage_composes_plans_to_fit_an_h100_and_renders(tmp_path):
    proc = check(["--dry-run", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [s.name for s in gpu_check.stages(gpu_check.gpu_mode("h100_sxm", 128))
            if s.kind in ("engine", "shape")]
    lines = proc.stdout.splitlines()
    assert len(runs) == 7 and [line.split(":")[0] for line in lines] == [f"[gpu-check dry-run] {n}" for n in runs]
    assert all("GiB per rank of 80" in line for line in lines)
    plans = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("runs/*/*/plan.json")}
    assert sorted(plans) == sorted(runs)
    assert plans["nd_meta"]["model_init"] == "meta" and plans["fsdp2"]["model_init"] == "full"
    # ~1B: Llama-3.2-1B's 1.24e9 parameters (tied embeddings counted once)
    assert plans["fsdp2"]["model"]["total_params"] == pytest.approx(1.236e9, rel=1e-3)


def test_an_unknown_stage_is_named_in_one_line(tmp_path):
    proc = check(["--cpu", "--only", "fsdp3", "--out", str(tmp_path)])
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("gpu-check: --only=fsdp3: no stage named fsdp3 (stages: ")


def test_a_meta_built_run_is_held_to_an_initialised_models_losses_and_fails_off_them():
    cfg = compose_run_config(["model=tiny_llama", "engine=nd"])
    at_uniform = [math.log(256) * (1 + 0.005)] * 3
    assert gpu_check.loss_check(cfg, "meta", at_uniform, None)[0]
    assert not gpu_check.loss_check(cfg, "meta", [x * 1.05 for x in at_uniform], None)[0]
    assert not gpu_check.loss_check(cfg, "meta", [x * 0.95 for x in at_uniform], None)[0]
    assert not gpu_check.loss_check(cfg, "meta", [float("nan")] * 3, None)[0]


def test_the_1b_models_initial_loss_passes_where_ln_vocab_alone_would_not():
    """Llama-3.2-1B starts at 12.17 (a logit's variance 0.02^2 * 2048 above uniform), 3.5 % over ln(vocab)."""
    cfg = compose_run_config(["model=llama3_2_1b", "engine=nd"])
    start = 12.166  # its loss at initialisation, measured on CPU with two of its layers
    ok, record = gpu_check.loss_check(cfg, "meta", [start, 12.0, 11.9], None)
    assert ok and record["reference"] == pytest.approx([11.7618, 12.1714], abs=1e-4)
    assert start / math.log(128256) - 1 > 0.02


def test_state_bytes_must_equal_the_plan_on_every_rank():
    cfg = compose_run_config(["model=tiny_llama", "engine=fsdp"])
    planned = {"param_bytes": 10, "grad_bytes": 10, "optimizer_bytes": 20, "host_bytes": 0}
    metrics = {"predicted": planned, "measured": {"per_rank": [{"rank": 0, **planned}, {"rank": 1, **planned}]}}
    assert gpu_check.state_bytes_check(cfg, metrics)[0]
    metrics["measured"]["per_rank"][1]["optimizer_bytes"] = 40
    ok, rows = gpu_check.state_bytes_check(cfg, metrics)
    assert not ok and rows["1"]["measured"]["optimizer_bytes"] == 40


def test_the_comparison_gives_the_predicted_band_and_where_the_measurement_fell():
    outcome = gpu_check.Outcome("fsdp_8gpu", "run", predicted={"tokens_per_s": 1000.0, "tokens_per_s_band": 0.09},
                                measured={"tokens_per_s": 800.0})
    header, line = gpu_check.comparison_lines([outcome])
    assert header.endswith("tokens/s band") and line.endswith("±9% below")
    assert "1,000 / 800" in line


class TwoReferences:
    """Stands in for gpu_check.References on a GPU: two reference runs that part from step 3 on."""

    def __init__(self, first, second):
        self.pair = (first, second)

    def losses(self, cfg, n_steps):
        return self.pair[0][:n_steps]

    def spread(self, cfg, n_steps):
        return gpu_check.References.spread(self, cfg, n_steps)

    def _pair(self, cfg, n_steps):
        return self.pair[0][:n_steps], self.pair[1][:n_steps]


def test_a_run_is_held_to_its_tolerance_plus_twice_the_references_own_spread():
    """FSDP's tolerance is 1e-4; where two references part by 1e-3 at step 3, a run may stray by 2.1e-3 from
    step 3 on, and by 1e-4 before."""
    cfg = compose_run_config(["model=tiny_llama", "engine=fsdp", "layout.precision=bf16"])
    reference = [10.0, 10.0, 10.0, 10.0]
    refs = TwoReferences(reference, [10.0, 10.0, 10.01, 10.0])
    assert refs.spread(cfg, 4) == pytest.approx([0.0, 0.0, 1e-3, 1e-3])
    ok, record = gpu_check.loss_check(cfg, "full", [10.0, 10.0, 10.02, 9.98], refs)
    assert ok and record["reference_spread"] == pytest.approx([0, 0, 1e-3, 1e-3]) and record["repeat_margin"] == 2
    assert not gpu_check.loss_check(cfg, "full", [10.0, 10.0, 10.03, 10.0], refs)[0]  # 3e-3 > 1e-4 + 2e-3
    assert not gpu_check.loss_check(cfg, "full", [10.0, 10.002, 10.0, 10.0], refs)[0]  # before they part: 1e-4
    same = TwoReferences(reference, reference)  # CPU: one reference, which repeats
    assert not gpu_check.loss_check(cfg, "full", [10.0, 10.0, 10.02, 9.98], same)[0]
