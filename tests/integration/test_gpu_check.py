"""`make gpu-check`'s CPU rehearsal (`--cpu`): the same stages through the same code on the tiny Llama, on one
CPU process, with the packages the GPU machine's image lacks hidden (wandb, datasets, plotly,
wandb-workspaces, megatron): every engine trains like one process and holds its planned bytes, the shape
is measured beside its prediction, `harness calibrate` runs, and the summary is one JSON file."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import REPO_ROOT
from harness.commands import gpu_check

pytestmark = pytest.mark.integration

# Not on the GPU image: hidden from this process's children and their ranks (a finder ahead of the path
# finder that does not find them, so `import wandb` fails and find_spec says absent, as there).
HIDDEN = ("wandb", "wandb_workspaces", "datasets", "plotly", "megatron")
SITECUSTOMIZE = f"""
import sys
from importlib.machinery import PathFinder

class Hidden(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.partition(".")[0] in {HIDDEN!r} else PathFinder.find_spec(name, path, target)

sys.meta_path = [Hidden if finder is PathFinder else finder for finder in sys.meta_path]
"""


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_check")
    (tmp / "hide").mkdir()
    (tmp / "hide" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": f"{tmp / 'hide'}:{REPO_ROOT}", "WANDB_MODE": "disabled"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness.commands.gpu_check", "--cpu", "--out", str(tmp / "out")],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - start
    print(f"\n  gpu-check --cpu: {seconds:.0f} s wall")
    return proc, json.loads((tmp / "out" / "summary.json").read_text()), seconds, env


def test_the_hidden_packages_are_hidden(rehearsal):
    env = rehearsal[3]
    probe = "import importlib.util as u; print([u.find_spec(n) is None for n in %r])" % (HIDDEN,)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout
    assert out.strip() == str([True] * len(HIDDEN))


def test_every_stage_passes_with_a_progress_line_each(rehearsal):
    proc, summary, seconds, _ = rehearsal
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    names = [stage.name for stage in gpu_check.stages(gpu_check.cpu_mode())]
    for index, name in enumerate(names, 1):
        tag = f"[gpu-check {index}/{len(names)}] "
        assert sum(line.startswith(tag) and name in line for line in proc.stdout.splitlines()) == 2, name
    assert proc.stdout.rstrip().splitlines()[-1].startswith("gpu-check: passed; summary: ")
    assert proc.stdout.startswith("[gpu-check] python ") and " torch " in proc.stdout.splitlines()[0]
    assert [s["name"] for s in summary["stages"]] == names
    assert all(s["status"] == "passed" for s in summary["stages"]), summary["stages"]
    assert summary["status"] == "passed" and seconds < summary["budget_s"]


def test_the_summary_holds_the_checks_and_the_comparison(rehearsal):
    summary = rehearsal[1]
    assert summary["schema"] == gpu_check.SCHEMA and summary["mode"] == "cpu"
    assert {"torch", "transformers", "accelerate", "deepspeed", "hydra-core"} <= set(summary["versions"])
    assert summary["tested_with"]["deepspeed"] and summary["device"]["torch"]
    stages = {s["name"]: s for s in summary["stages"]}
    rules = {"deepspeed_zero3_offload": "single process", "fsdp2": "single process", "nd_meta": "initialised model"}
    for name, rule in rules.items():
        checks = stages[name]["checks"]
        assert checks["loss"]["rule"] == rule and checks["loss"]["max_rel_error"] <= checks["loss"]["rtol"]
        # at least two warm-up steps (more until steady, at most bench.warmup_max_steps=6) and three timed
        assert 5 <= len(checks["loss"]["losses"]) <= 9
        rank0 = checks["state_bytes"]["0"]
        assert rank0["measured"] == rank0["planned"] and rank0["measured"]["param_bytes"] + rank0["measured"].get(
            "host_bytes", 0) > 0
    assert stages["deepspeed_zero3_offload"]["checks"]["state_bytes"]["0"]["measured"]["host_bytes"] > 0
    for name, stage in stages.items():
        if stage["kind"] in ("engine", "shape"):
            assert set(stage["predicted"]) == {*gpu_check.PREDICTED_KEYS, "tokens_per_s_band"}, name
            assert stage["measured"]["tokens_per_s"] > 0 and stage["predicted"]["step_time_s"] > 0, name
            assert stage["measured"]["peak_allocated_bytes"] is None  # no CUDA allocator on CPU
            ratio = stage["measured_over_predicted"]
            assert ratio["step_time_s"] == stage["measured"]["step_time_s"] / stage["predicted"]["step_time_s"]
            assert ratio["peak_allocated_bytes"] is None
    assert stages["calibrate"]["measured"]["measured_peak_flops"] > 0
    table = summary["comparison"]
    assert table[0].startswith("run") and len(table) == 1 + len(stages) - 2  # not calibrate, not components
    assert table == rehearsal[0].stdout.split("predicted / measured")[1].splitlines()[1:len(table) + 1]


def test_the_components_are_timed_beside_their_predictions(rehearsal):
    """GEMMs in their three directions, attention and a decoder layer forward and backward, each with a time
    and, where the host's calibrated profile is cached (the calibrate stage of an earlier check or a planner run),
    a prediction; the summary names every part."""
    components = next(s for s in rehearsal[1]["stages"] if s["name"] == "components")
    assert components["status"] == "passed"
    parts = {f"{c}/{d}" for c, ds in (("gemm", ("forward", "input_grad", "weight_grad")),
                                      ("attention", ("forward", "backward")), ("layer", ("forward", "backward")))
             for d in ds}
    assert set(components["measured"]) == parts
    rows = json.loads((Path(components["run_dir"]) / "components.json").read_text())["rows"]
    assert {f"{r['component']}/{r['direction']}" for r in rows} == parts
    assert all(r["measured_s"] > 0 for r in rows)
    # 6 distinct GEMMs of the tiny Llama at tp 1 and 2, three directions; 2 sequence lengths; one layer
    assert [sum(r["component"] == c for r in rows) for c in ("gemm", "attention", "layer")] == [18, 4, 2]
