"""The launch contract of every GPU recipe, read from what a dry run writes, as a first user's cluster would
take it: the job asks for whole nodes or explicit CPUs and memory, offload gets more than one thread per
rank, each launcher line parses with that launcher's own argument parser, and a local run's rendered.json
holds a runnable line (no `{placeholders}`)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from harness import REPO_ROOT
from harness.config.compose import compose_run_config
from harness.engines import engine_module, registry
from harness.launch import local
from harness.launch.prepare import prepare_run
from harness.launch.sbatch import render_job_script
from harness.launch.threads import offloads
from harness.rundir import RENDERED_FILE

GPU_RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("gpu_*.yaml"))
# An H100 node's CPUs as Slurm counts them: DGX H100, 2x Xeon Platinum 8480C, 2 x 56 cores x 2 threads
# (NVIDIA DGX H100 datasheet).
NODE_CPUS = 224
# The node's view inside the job: the values the job script's variables take on node 1.
NODE_VALUES = {"$SLURM_NODEID": "1", "$MASTER_ADDR": "10.0.0.1", "$MASTER_PORT": "24242"}
PLACEHOLDER = re.compile(r"\{[a-z_]+\}")


def dry_run(recipe: str, run_dir: Path):
    cfg = compose_run_config([f"recipes={recipe}", "tracking=disabled"])
    run_dir.mkdir(parents=True, exist_ok=True)
    rendered = engine_module(cfg.engine.name).render(cfg, run_dir)
    return cfg, rendered, render_job_script(cfg, rendered)


def sbatch_lines(text: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH ")]


def node_argv(text: str) -> list[str]:
    """The launcher line one node's task runs: the `bash -c` argument of the srun command, split as bash
    would on node 1 (its only expansions are the three rendezvous variables, each a whole quoted word)."""
    start = text.index("\nsrun ")
    srun = shlex.split(text[start:text.index("\nrc=$?", start)].replace("\\\n", " "))
    command = shlex.split(srun[srun.index("-c", srun.index("bash")) + 1])
    assert command[0] == "exec"
    words = [NODE_VALUES.get(word, word) for word in command[1:]]
    # The node's supervisor runs the launcher: PYTHON -m harness.launch.watchdog --node RUN_DIR -- LAUNCHER...
    assert words[1:4] == ["-m", "harness.launch.watchdog", "--node"], words
    return words[words.index("--") + 1:]


def job_threads(text: str) -> int:
    lines = text[text.index("# Intra-op threads"):text.index("export PYTHONUNBUFFERED")]
    env = {"PATH": os.environ["PATH"], "SLURM_CPUS_ON_NODE": str(NODE_CPUS)}
    return int(subprocess.run(["bash", "-euc", lines + 'echo "$OMP_NUM_THREADS"'], env=env,
                              capture_output=True, text=True, check=True).stdout)


def parse_launcher(argv: list[str]) -> dict:
    """The rendezvous and program as the launcher's own argument parser reads them."""
    name = Path(argv[0]).name
    if name == "torchrun":
        from torch.distributed.run import get_args_parser

        a = get_args_parser().parse_args(argv[1:])
        return dict(nodes=int(a.nnodes), per_node=int(a.nproc_per_node), node_rank=a.node_rank,
                    addr=a.master_addr, port=a.master_port, program=a.training_script, args=a.training_script_args)
    if name == "accelerate":
        from accelerate.commands.launch import launch_command_parser

        assert argv[1] == "launch"
        a = launch_command_parser().parse_args(argv[2:])
        assert a.module and Path(a.config_file).is_file()
        return dict(nodes=a.num_machines, per_node=a.num_processes // a.num_machines, node_rank=a.machine_rank,
                    addr=a.main_process_ip, port=a.main_process_port, program=a.training_script,
                    args=a.training_script_args)
    if name == "deepspeed":
        from deepspeed.launcher.runner import parse_args

        a = parse_args(argv[1:])
        assert a.no_ssh and a.no_local_rank and a.module
        return dict(nodes=a.num_nodes, per_node=a.num_gpus, node_rank=a.node_rank, addr=a.master_addr,
                    port=a.master_port, program=a.user_script, args=a.user_args)
    raise AssertionError(f"unknown launcher {argv[0]}")


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_job_asks_for_whole_nodes_or_explicit_cpus_and_memory(recipe, tmp_path):
    _, _, text = dry_run(recipe, tmp_path / "run")
    lines = sbatch_lines(text)
    assert any(line.startswith("--mem") for line in lines), lines
    assert "--exclusive" in lines or any(line.startswith("--cpus-per-task") for line in lines), lines


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_ranks_get_the_nodes_cores_and_offload_more_than_one(recipe, tmp_path):
    cfg, _, text = dry_run(recipe, tmp_path / "run")
    threads = job_threads(text)
    assert threads == NODE_CPUS // cfg.cluster.accelerators_per_node
    if offloads(cfg):
        assert threads > 1


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_launcher_line_parses_with_the_launchers_own_parser(recipe, tmp_path):
    cfg, rendered, text = dry_run(recipe, tmp_path / "run")
    parsed = parse_launcher(node_argv(text))
    assert parsed == dict(nodes=cfg.cluster.nodes, per_node=cfg.cluster.accelerators_per_node, node_rank=1,
                          addr="10.0.0.1", port=24242, program=parsed["program"], args=parsed["args"])
    if registry.engine(cfg.engine.name).export_only:
        assert parsed["program"] == "pretrain_gpt.py"  # documentation only; megatron_args.sh is what runs
    else:
        assert (parsed["program"], parsed["args"]) == ("harness.runtime.bench", [str(tmp_path / "run")])


SINGLE_NODE = [r for r in GPU_RECIPES if compose_run_config([f"recipes={r}"]).cluster.nodes == 1]
SINGLE_NODE_DEEPSPEED = [r for r in SINGLE_NODE if compose_run_config([f"recipes={r}"]).engine.name == "deepspeed"]


@pytest.mark.parametrize("recipe", SINGLE_NODE)
def test_local_run_records_a_runnable_line(recipe, tmp_path):
    cfg = compose_run_config([f"recipes={recipe}", "launcher=local", "tracking=disabled"])
    prepared = prepare_run(cfg, tmp_path / "run")
    saved = (tmp_path / "run" / RENDERED_FILE).read_text()
    assert not PLACEHOLDER.search(saved), saved
    parsed = parse_launcher(json.loads(saved)["argv"])
    assert (parsed["node_rank"], parsed["addr"]) == (0, local.LOOPBACK)
    assert prepared.rendered.command_line() == shlex.join(json.loads(saved)["argv"])


@pytest.mark.parametrize("recipe", SINGLE_NODE_DEEPSPEED)
def test_deepspeed_runner_line_of_a_local_run(recipe, tmp_path):
    cfg = compose_run_config([f"recipes={recipe}", "launcher=local", "engine.launcher=deepspeed", "tracking=disabled"])
    prepare_run(cfg, tmp_path / "run")
    parsed = parse_launcher(json.loads((tmp_path / "run" / RENDERED_FILE).read_text())["argv"])
    assert (parsed["program"], parsed["args"]) == ("harness.runtime.bench", [str(tmp_path / "run")])


def test_a_local_launch_records_and_prints_the_line_it_ran(tmp_path, monkeypatch):
    cfg = compose_run_config(["recipes=cpu_zero2", "tracking=disabled"])
    prepared = prepare_run(cfg, tmp_path / "run")
    started = {}
    monkeypatch.setattr(local, "free_port", lambda: 31234)
    monkeypatch.setattr(local, "_run_watched", lambda run_dir, argv, env, timeout_s: started.update(argv=argv) or 1)
    printed = []
    local.launch_local(prepared.rendered, 60, {}, announce=printed.append)
    saved = json.loads((tmp_path / "run" / RENDERED_FILE).read_text())["argv"]
    assert parse_launcher(saved)["port"] == 31234 and not PLACEHOLDER.search(" ".join(saved))
    assert printed == [shlex.join(saved)] and started["argv"] == saved


CPU_RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("cpu_*.yaml"))


def test_preparing_any_engines_run_imports_neither_torch_nor_the_model_libraries(tmp_path):
    """The controller plans and renders every engine's run from the cached model shape (FSDP's wrapped layer
    class, the nd engine's TP plan): importing torch and transformers would cost every command seconds of CPU
    that only the ranks need."""
    import sys

    recipes = CPU_RECIPES + ["gpu_llama70b_megatron_tp8_pp4", "gpu_llama8b_fsdp_tp2_8gpu"]
    probe = ("import sys, pathlib; from harness.config.compose import compose_run_config; "
             "from harness.launch.prepare import prepare_run; "
             f"[prepare_run(compose_run_config(['recipes=' + r]), pathlib.Path({str(tmp_path)!r}) / r) "
             f"for r in {recipes!r}]; "
             "print(sorted({'torch', 'transformers', 'deepspeed', 'accelerate'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "[]", done.stdout
    assert len(list(tmp_path.glob("*/rendered.json"))) == len(recipes)
