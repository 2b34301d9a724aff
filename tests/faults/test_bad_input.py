"""Bad input, table-driven: every case is refused before any process starts, naming the field, no traceback.

Cases run through `harness.cli.main` in this process (a subprocess per case would take minutes); a few at
the end run the installed command line to show the same from a shell.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO_ROOT, cli

# (case id, arguments after `harness`, what the message must name). `{data}` is a folder of bad data files.
CASES = [
    ("engine option of another engine", ["plan", "engine=fsdp", "engine.compiled_ops=true"], "engine.compiled_ops"),
    ("precision fp7", ["plan", "layout.precision=fp7"], "layout.precision"),
    ("unknown model preset", ["plan", "model=nonexistent"], "model='nonexistent'"),
    ("misspelled key", ["plan", "layout.zero_stagee=2"], "layout.zero_stagee"),
    ("word for a degree", ["plan", "layout.tp=two"], "layout.tp"),
    ("fraction for a degree", ["plan", "layout.dp_shard=2.5"], "layout.dp_shard"),
    ("unknown engine preset", ["plan", "engine=megatron2"], "engine='megatron2'"),
    ("unknown engine name", ["run", "engine.name=megatron2"], "engine.name"),
    ("tracking mode", ["run", "tracking.mode=foo"], "tracking.mode"),
    ("tracking backend", ["run", "tracking.backend=foo"], "tracking.backend"),
    ("launcher backend", ["run", "launcher.backend=foo"], "launcher.backend"),
    ("data kind", ["run", "data.kind=foo"], "data.kind"),
    ("offload optimizer target", ["plan", "layout.offload_optimizer=disk"], "layout.offload_optimizer"),
    ("offload params target", ["plan", "layout.offload_params=gpu"], "layout.offload_params"),
    ("checkpointing", ["plan", "layout.activation_checkpointing=some"], "layout.activation_checkpointing"),
    ("pipeline schedule case", ["plan", "layout.pp_schedule=1f1b"], "layout.pp_schedule"),
    ("flop attention", ["plan", "bench.flop_attention=sliding"], "bench.flop_attention"),
    ("model init", ["plan", "model.init=lazy"], "model.init"),
    ("engine launcher", ["plan", "engine.launcher=mpirun"], "engine.launcher"),
    ("zero stage 4", ["plan", "layout.zero_stage=4"], "layout.zero_stage"),
    ("zero stage -1", ["plan", "layout.zero_stage=-1"], "layout.zero_stage"),
    ("fsdp version 3", ["plan", "engine=fsdp", "engine.fsdp_version=3"], "engine.fsdp_version"),
    ("fsdp option on deepspeed", ["plan", "engine=deepspeed", "engine.fsdp_version=1"], "engine.fsdp_version"),
    ("nd option on fsdp", ["plan", "engine=fsdp", "engine.sequence_parallel=true"], "engine.sequence_parallel"),
    ("fsdp1 prefetch on fsdp2", ["plan", "engine=fsdp", "engine.backward_prefetch=BACKWARD_POST"],
     "engine.backward_prefetch"),
    ("backward prefetch value", ["plan", "engine=fsdp", "engine.fsdp_version=1", "engine.backward_prefetch=LATER"],
     "engine.backward_prefetch"),
    ("negative time limit", ["run", "launcher.timeout_s=-1"], "launcher.timeout_s"),
    ("zero time limit", ["run", "launcher.timeout_s=0"], "launcher.timeout_s"),
    ("negative host memory", ["plan", "cluster.host_memory_gib=-1"], "cluster.host_memory_gib"),
    ("infinite host memory", ["plan", "cluster.host_memory_gib=inf"], "cluster.host_memory_gib"),
    ("zero device memory", ["plan", "cluster.memory_per_accelerator_gib=0"], "cluster.memory_per_accelerator_gib"),
    ("allowance above one", ["plan", "cluster.memory_allowance_fraction=1.5"], "cluster.memory_allowance_fraction"),
    ("negative fixed allowance", ["plan", "cluster.memory_allowance_fixed_gib=-2"],
     "cluster.memory_allowance_fixed_gib"),
    ("negative bandwidth", ["plan", "cluster.intra_node_gbps=-1"], "cluster.intra_node_gbps"),
    ("no nodes", ["plan", "cluster.nodes=0"], "cluster.nodes"),
    ("no accelerators", ["plan", "cluster.accelerators_per_node=0"], "cluster.accelerators_per_node"),
    ("unknown accelerator", ["plan", "cluster.accelerator=h999"], "cluster.accelerator='h999'"),
    ("misspelled accelerator", ["run", "cluster.accelerator=h100_sxn"], "did you mean 'h100_sxm'"),
    ("lr nan", ["run", "bench.lr=nan"], "bench.lr"),
    # a size below 1 is named itself, not as a world the open dp_shard cannot fill
    ("tp zero on a gpu cluster", ["plan", "model=llama3_1_8b", "cluster=gpu_h100_1x8", "layout.tp=0"],
     "layout.tp=0 must be >= 1"),
    ("no nodes on a gpu cluster", ["plan", "model=llama3_1_8b", "cluster=gpu_h100_1x8", "cluster.nodes=0"],
     "cluster.nodes=0 must be >= 1"),
    ("recommend over two engines", ["recommend", "--global-batch", "8", "--no-write", "model=llama3_1_8b",
                                    "cluster=gpu_h100_1x8", "engine=deepspeed,fsdp"],
     "the search ranks within one engine"),
    # a refused single run writes nothing (it left a PRUNED folder a later report took for a sweep)
    ("run beyond the world", ["run", "recipes=cpu_zero2", "layout.dp_shard=3"], "must equal cluster.nodes=1"),
    ("run with tp over the heads", ["run", "recipes=cpu_zero2", "layout.tp=4", "layout.dp_shard=1"], "tp=4"),
    ("lr zero", ["plan", "bench.lr=0"], "bench.lr"),
    ("lr negative", ["plan", "bench.lr=-1e-3"], "bench.lr"),
    ("negative weight decay", ["plan", "bench.weight_decay=-0.1"], "bench.weight_decay"),
    ("grad clip nan", ["plan", "bench.grad_clip=nan"], "bench.grad_clip"),
    ("no steps", ["run", "bench.steps=0"], "bench.steps"),
    ("negative warm-up", ["plan", "bench.warmup_steps=-1"], "bench.warmup_steps"),
    ("warm-up cap below the least", ["run", "bench.warmup_max_steps=1"], "bench.warmup_max_steps=1 must be >= "
                                                                          "bench.warmup_steps=2"),
    ("no repeats", ["sweep", "bench.repeats=0"], "bench.repeats"),
    ("negative repeat", ["plan", "bench.repeat=-1"], "bench.repeat"),
    ("micro batch 0", ["run", "layout.micro_batch=0"], "layout.micro_batch"),
    ("grad accum 0", ["plan", "layout.grad_accum=0"], "layout.grad_accum"),
    ("seq len 0", ["plan", "layout.seq_len=0"], "layout.seq_len"),
    ("virtual stages 0", ["plan", "layout.pp_virtual_stages=0"], "layout.pp_virtual_stages"),
    ("negative pipeline stage", ["plan", "layout.pp_stage_layers=[-1,3]"], "layout.pp_stage_layers[0]"),
    ("world size mismatch", ["plan", "layout.dp_shard=4"], "dp_shard=4"),
    ("vocab size 0", ["run", "model.hf_config.vocab_size=0"], "model.hf_config.vocab_size"),
    ("negative layers", ["plan", "model.hf_config.num_hidden_layers=-2"], "model.hf_config.num_hidden_layers"),
    ("fractional hidden size", ["plan", "model.hf_config.hidden_size=1.5"], "model.hf_config.hidden_size"),
    ("hub id with spaces", ["plan", "model.hub_id='bad id'"], "model.hub_id"),
    ("empty sweep name", ["run", "sweep_name=''"], "sweep_name"),
    ("sweep name with a slash", ["run", "sweep_name=a/b"], "sweep_name"),
    ("sweep name with a leading dot", ["run", "sweep_name=.hidden"], "sweep_name"),
    ("sweep name escaping results", ["run", "sweep_name=../../escape"], "sweep_name"),
    ("layout name with a slash", ["run", "layout.name=x/y"], "layout.name"),
    ("layout name with a leading dash", ["run", "layout.name=-x"], "layout.name"),
    ("model name with a space", ["plan", "model.name='tiny llama'"], "model.name"),
    ("text data without a path", ["run", "data=text"], "data.path"),
    ("missing data file", ["run", "data=text", "data.path={data}/missing.txt"], "does not exist"),
    ("empty data file", ["run", "data=text", "data.path={data}/empty.txt"], "is empty"),
    ("binary data file", ["run", "data=text", "data.path={data}/binary.txt"], "does not decode"),
    ("latin-1 data file", ["run", "data=text", "data.path={data}/latin1.txt"], "does not decode"),
    ("too few tokens", ["run", "data=text", "data.path={data}/short.txt"], "fewer than one micro-batch"),
    ("corrupt jsonl", ["run", "data=text", "data.path={data}/bad.jsonl"], "does not decode as json"),
    ("jsonl without the column", ["run", "data=text", "data.path={data}/nocolumn.jsonl"], "data.text_column"),
    ("data path is a folder", ["run", "data=text", "data.path={data}"], "is not a regular file"),
    ("sbatch option smuggled in a comment", ["run", "launcher.extra_sbatch=['--comment=x --output=/tmp/p-%j.log']"],
     "launcher.extra_sbatch[0]"),
    ("sbatch --output", ["plan", "launcher.extra_sbatch=['--output=/tmp/x']"], "sets --output"),
    ("sbatch -o", ["plan", "launcher.extra_sbatch=['-o /tmp/x']"], "sets --output"),
    ("sbatch --out prefix", ["plan", "launcher.extra_sbatch=['--out=/tmp/x']"], "sets --output"),
    ("sbatch -J", ["plan", "launcher.extra_sbatch=['-Jname']"], "sets --job-name"),
    ("sbatch --chdir", ["plan", "launcher.extra_sbatch=['--chdir=/']"], "sets --chdir"),
    ("sbatch -a", ["plan", "launcher.extra_sbatch=['-a 1-3']"], "sets --array"),
    ("sbatch -e", ["plan", "launcher.extra_sbatch=['-e/tmp/e']"], "sets --error"),
    ("sbatch % pattern", ["plan", "launcher.extra_sbatch=['--comment=%j']"], "'%' pattern"),
    ("sbatch not an option", ["plan", "launcher.extra_sbatch=['mem=0']"], "launcher.extra_sbatch[0]"),
    ("unknown recipe", ["run", "recipes=not_a_recipe"], "recipes='not_a_recipe'"),
    ("tracking timeout 0", ["plan", "tracking.init_timeout_s=0"], "tracking.init_timeout_s"),
    ("array concurrency 0", ["plan", "launcher.array_concurrency=0"], "launcher.array_concurrency"),
    ("negative data seed", ["plan", "data.seed=-1"], "data.seed"),
    ("unparsable override", ["plan", "layout.pp_stage_layers=[1,2"], "cannot parse the override"),
    ("sweep with an unknown key", ["sweep", "layout.zero_stagee=1,2", "--dry-run"], "layout.zero_stagee"),
    ("sweep with a bad value", ["sweep", "layout.precision=fp7,bf16", "--dry-run"], "layout.precision"),
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    (folder / "empty.txt").write_bytes(b"")
    (folder / "binary.txt").write_bytes(bytes(range(256)) * 8)
    (folder / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 200)
    (folder / "short.txt").write_text("too short\n")
    (folder / "bad.jsonl").write_text('{"text": "a"}\n{"text": \n' * 50)
    (folder / "nocolumn.jsonl").write_text('{"body": "some words here"}\n' * 50)
    return folder


@pytest.fixture
def no_launch(monkeypatch):
    """Any attempt to start a process of a run fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a run was launched")

    monkeypatch.setattr("harness.launch.local.launch_local", refuse)
    monkeypatch.setattr("harness.launch.local._run_watched", refuse)


@pytest.mark.parametrize("case, args, names", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_before_launch(case, args, names, data_dir, tmp_path, monkeypatch, capsys, no_launch):
    results = tmp_path / "results"
    argv = [arg.replace("{data}", str(data_dir)) for arg in args] + [f"results_dir={results}"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["harness", *argv])
    code = cli.main()
    out = capsys.readouterr()
    text = out.out + out.err
    assert code in (1, 2), f"{case}: exit {code}"
    assert names in text, f"{case}: {text[-2000:]}"
    assert "Traceback" not in text
    if code == 2:  # refused at composition: one line, and nothing on disk at all
        assert len(out.err.strip().splitlines()) == 1, out.err
        assert not results.exists() and [p.name for p in tmp_path.iterdir()] == [], list(tmp_path.iterdir())
    launched = [p for p in results.rglob("*") if p.name in ("launch.log", "rendered.json", "run.lock")]
    assert launched == []
    escaped = set(tmp_path.parent.iterdir()) - {tmp_path}
    assert not any(p.name == "escape" for p in escaped)


def test_the_table_holds_at_least_sixty_cases():
    assert len(CASES) >= 60 and len({case for case, _, _ in CASES}) == len(CASES)


@pytest.mark.parametrize("args, first_line", [
    (["plan", "engine=fsdp", "engine.compiled_ops=true"],
     "harness plan: engine.compiled_ops is an option of engine=deepspeed, not a field of engine (FsdpOptions: name, "
     "launcher, compile, fsdp_version, backward_prefetch)"),
    (["plan", "layout.precision=fp7"], "harness plan: layout.precision='fp7' must be one of bf16, fp16, fp32, fp8 "
                                       "(did you mean 'fp8'?)"),
    (["run", "engine.name=megatron2"], "harness run: engine.name='megatron2' must be one of deepspeed, fsdp, nd, "
                                       "megatron_lm (did you mean 'megatron_lm'?)"),
])
def test_the_command_line_prints_one_line(args, first_line, tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness.cli", *args, f"results_dir={tmp_path}/r"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    assert out.returncode == 2 and out.stderr.strip() == first_line, out.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["run", "plan", "sweep", "report"])
def test_help_works_in_every_subcommand(command, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["harness", command, "--help"])
    assert cli.main() == 0
    out = capsys.readouterr()
    assert out.out.startswith("usage:") and f"harness {command}" in out.out and out.err == ""


def test_a_refused_single_run_writes_no_folder(tmp_path, monkeypatch, capsys, no_launch):
    """`harness run` of one refused layout is judged before Hydra makes its folder: exit 2, one line, nothing on
    disk (a PRUNED folder was left, and `harness report` then called it a sweep with one pruned run)."""
    results = tmp_path / "results"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["harness", "run", "recipes=cpu_zero2", "layout.dp_shard=3",
                                      f"results_dir={results}"])
    code = cli.main()
    err = capsys.readouterr().err
    assert code == 2 and not results.exists()
    assert err.startswith("harness run: the run was not launched: dp_replicate=1 x dp_shard=3")
