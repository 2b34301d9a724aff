"""megatron_args.sh takes its rendezvous from Slurm's job variables, else one node on this host; the user's
NODE_RANK / MASTER_ADDR / MASTER_PORT win. The script runs in bash with stand-ins for torchrun and scontrol."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config.compose import compose_run_config
from harness.engines.megatron_lm import SCRIPT_FILE, render

EIGHT_NODES = ["recipes=gpu_llama70b_megatron_tp8_pp4"]
ONE_NODE = ["engine=megatron_lm", "model=llama3_1_8b", "cluster=gpu_h100_1x8", "layout=single", "layout.tp=8",
            "layout.dp_shard=1"]
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_NODEID": "3", "SLURM_JOB_NODELIST": "gpu[001-008]"}


def run_script(overrides, tmp_path: Path, env: dict) -> subprocess.CompletedProcess:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    render(compose_run_config(overrides), run_dir)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "torchrun").write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open('torchrun.json', 'w'))\n")
    (stubs / "scontrol").write_text(
        "#!/bin/bash\n"
        'if [[ $2 == hostnames ]]; then printf "gpu%03d\\n" 1 2 3 4 5 6 7 8; '
        'else echo "NodeName=$3 NodeAddr=10.0.0.1 Port=0"; fi\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("SLURM_") and k not in ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
    full_env = {**clean, "PATH": f"{stubs}:{os.environ['PATH']}", "MEGATRON_LM": str(tmp_path / "megatron"), **env}
    return subprocess.run(["bash", str(run_dir / SCRIPT_FILE)], cwd=tmp_path, env=full_env,
                          capture_output=True, text=True, timeout=60)


def rendezvous(tmp_path: Path) -> dict:
    argv = json.loads((tmp_path / "torchrun.json").read_text())
    return {flag: argv[argv.index(flag) + 1] for flag in ("--nnodes", "--node_rank", "--master_addr", "--master_port")}


def test_under_slurm_the_job_gives_node_rank_first_node_and_port(tmp_path):
    proc = run_script(EIGHT_NODES, tmp_path, SLURM)
    assert proc.returncode == 0, proc.stderr
    assert rendezvous(tmp_path) == {"--nnodes": "8", "--node_rank": "3", "--master_addr": "10.0.0.1",
                                    "--master_port": str(20000 + 4242 % 10000)}


def test_the_users_environment_wins_over_slurm(tmp_path):
    env = {**SLURM, "NODE_RANK": "5", "MASTER_ADDR": "head.example", "MASTER_PORT": "31000"}
    proc = run_script(EIGHT_NODES, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert rendezvous(tmp_path) == {"--nnodes": "8", "--node_rank": "5", "--master_addr": "head.example",
                                    "--master_port": "31000"}


def test_one_node_outside_slurm_rendezvouses_on_this_host(tmp_path):
    proc = run_script(ONE_NODE, tmp_path, {})
    assert proc.returncode == 0, proc.stderr
    assert rendezvous(tmp_path) == {"--nnodes": "1", "--node_rank": "0", "--master_addr": "127.0.0.1",
                                    "--master_port": "29500"}


def test_several_nodes_outside_slurm_must_be_told(tmp_path):
    proc = run_script(EIGHT_NODES, tmp_path, {})
    assert proc.returncode != 0 and not (tmp_path / "torchrun.json").exists()
    assert "set NODE_RANK, MASTER_ADDR and MASTER_PORT on every node (or run under Slurm)" in proc.stderr
