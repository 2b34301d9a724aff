"""OMP_NUM_THREADS per rank: one rule (harness.launch.threads) for local runs and job.sbatch; offload gets
the node's cores split among its ranks; a caller's OMP_NUM_THREADS wins."""

from __future__ import annotations

import os
import subprocess

import pytest

from harness.config.compose import compose_run_config
from harness.engines import engine_module
from harness.engines.rendered import RenderedRun
from harness.launch import local
from harness.launch.sbatch import render_job_script
from harness.launch.threads import ThreadRule, local_threads, thread_rule

OFFLOAD_1GPU = ["recipes=gpu_llama8b_zero3_offload_1gpu", "tracking=disabled"]
FSDP_8GPU = ["recipes=gpu_llama8b_fsdp_8gpu", "tracking=disabled"]
CPU_OFFLOAD = ["recipes=cpu_zero2_offload", "tracking=disabled"]
CPU_PLAIN = ["recipes=cpu_zero2", "tracking=disabled"]


def job_threads(overrides, tmp_path, env) -> int:
    """OMP_NUM_THREADS as job.sbatch's own lines set it, run in bash under a Slurm-like environment."""
    cfg = compose_run_config(overrides)
    text = render_job_script(cfg, engine_module(cfg.engine.name).render(cfg, tmp_path))
    lines = text[text.index("# Intra-op threads"):text.index("export PYTHONUNBUFFERED")]
    clean = {"PATH": os.environ["PATH"], **env}
    out = subprocess.run(["bash", "-euc", lines + 'echo "$OMP_NUM_THREADS"'], env=clean, capture_output=True,
                         text=True, check=True).stdout
    return int(out)


@pytest.mark.parametrize("overrides,env,threads", [
    (OFFLOAD_1GPU, {"SLURM_CPUS_ON_NODE": "224"}, 224),  # one rank with an exclusive node: every core
    (FSDP_8GPU, {"SLURM_CPUS_ON_NODE": "224"}, 28),
    (FSDP_8GPU, {"SLURM_CPUS_ON_NODE": "4"}, 1),  # fewer CPUs than ranks: still one
    (FSDP_8GPU, {"SLURM_CPUS_PER_TASK": "64", "SLURM_CPUS_ON_NODE": "224"}, 8),  # the task's CPUs, not the node's
    (OFFLOAD_1GPU, {"SLURM_CPUS_ON_NODE": "224", "OMP_NUM_THREADS": "3"}, 3),  # the caller's value wins
    (CPU_PLAIN + ["launcher=slurm_local"], {"SLURM_CPUS_PER_TASK": "8"}, 1),  # a CPU rank is one core
    (CPU_OFFLOAD + ["launcher=slurm_local"], {"SLURM_CPUS_PER_TASK": "8"}, 4),
])
def test_job_script_threads(overrides, env, threads, tmp_path):
    assert job_threads(overrides, tmp_path, env) == threads


@pytest.mark.parametrize("rule", [ThreadRule(1, True), ThreadRule(3, True), ThreadRule(8, True), ThreadRule(8, False)])
def test_shell_and_python_agree(rule):
    script = "; ".join(f"node_cpus={cpus}; echo {rule.shell()}" for cpus in range(1, 40))
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert [int(x) for x in out] == [rule.threads(cpus) for cpus in range(1, 40)]


def test_offload_splits_the_local_cores(monkeypatch):
    monkeypatch.setattr("harness.launch.threads.local_cpus", lambda: 16)
    assert local_threads(compose_run_config(OFFLOAD_1GPU)) == 16
    assert local_threads(compose_run_config(CPU_OFFLOAD)) == 8  # two CPU ranks
    assert local_threads(compose_run_config(CPU_PLAIN)) == 1
    assert thread_rule(compose_run_config(FSDP_8GPU)).threads(16) == 2


def test_local_launch_environment(monkeypatch):
    rendered = RenderedRun("/x", "deepspeed", "torchrun", 1, 2, ["torchrun"])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert local.rank_environment(rendered, {}, threads=6)["OMP_NUM_THREADS"] == "6"
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert local.rank_environment(rendered, {}, threads=6)["OMP_NUM_THREADS"] == "2"


def test_run_prepared_hands_the_rule_to_the_local_launcher(monkeypatch, tmp_path):
    from harness.launch import run

    seen = {}
    monkeypatch.setattr(run, "launch_local", lambda *args, **kw: seen.update(kw) or ("COMPLETED", ""))
    monkeypatch.setattr("harness.launch.threads.local_cpus", lambda: 12)
    cfg = compose_run_config(CPU_OFFLOAD)
    run.run_prepared(tmp_path, cfg, RenderedRun(str(tmp_path), "deepspeed", "torchrun", 1, 2, ["torchrun"]),
                     say=lambda line: None)
    assert seen["threads"] == 6
