"""Inputs refused before any work: no measuring, no launch, no file written outside its place; and the
Hydra habits every command shares (--cfg, --config-dir, --shell-completion, --help)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.config.checks import sbatch_option_problems
from harness.config.compose import CONFIG_DIR
from harness.doctor import WARN, wandb_facts


def harness(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["harness", *args])
    try:
        code = cli.main()
    except SystemExit as exit_info:  # argparse's --help
        code = exit_info.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def no_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)


def test_report_on_a_folder_without_runs_says_so_and_writes_nothing(tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("no runs\n")
    code, out, err = harness(monkeypatch, capsys, "report", str(tmp_path))
    assert code == 1 and err.strip().startswith(f"harness report: no runs found in {tmp_path}")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_recommend_name_cannot_leave_hydra_configs(tmp_path, monkeypatch, capsys):
    target = tmp_path / "escaped"
    name = str(Path("../" * (len(CONFIG_DIR.parts) + 2)) / str(target).lstrip("/"))
    code, _, err = harness(monkeypatch, capsys, "recommend", "--global-batch", "8", "--top", "1", "--name", name)
    assert code == 2 and "argument --name" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("*"))


def test_calibrate_name_cannot_leave_the_profile_cache(monkeypatch, capsys):
    import harness.runtime.calibrate as calibrate

    monkeypatch.setattr(calibrate, "measure_local", lambda *a, **k: pytest.fail("measured before refusing"))
    code, _, err = harness(monkeypatch, capsys, "calibrate", "--name", "../../x")
    assert code == 2 and "argument --name: '../../x' must be a name" in err


def test_calibrate_out_under_a_file_is_refused_before_measuring(tmp_path, monkeypatch, capsys):
    import harness.runtime.calibrate as calibrate

    (tmp_path / "file").write_text("")
    monkeypatch.setattr(calibrate, "measure_local", lambda *a, **k: pytest.fail("measured before refusing"))
    code, _, err = harness(monkeypatch, capsys, "calibrate", "--out", str(tmp_path / "file" / "p.json"))
    assert code == 2 and f"its folder {tmp_path / 'file'} is a file" in err


@pytest.mark.parametrize("value", ["afile", "afile/below"])
@pytest.mark.parametrize("command", [["run"], ["sweep", "--dry-run"]])
def test_a_results_dir_that_cannot_hold_runs_is_one_line(command, value, tmp_path, monkeypatch, capsys, no_process):
    (tmp_path / "afile").write_text("")
    code, _, err = harness(monkeypatch, capsys, *command, f"results_dir={tmp_path / value}")
    assert code == 2 and "results_dir=" in err and "is a file" in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]


def test_a_read_only_results_dir_is_one_line(monkeypatch, capsys, no_process):
    code, _, err = harness(monkeypatch, capsys, "run", "results_dir=/proc/sys/harness-results")
    assert code == 2 and err.strip() == ("harness run: results_dir='/proc/sys/harness-results' lies under /proc/sys, "
                                         "which is not writable")


@pytest.mark.parametrize("poll", ["-1", "nan", "abc"])
def test_a_bad_poll_interval_submits_nothing(poll, tmp_path, monkeypatch, capsys, no_process):
    code, _, err = harness(monkeypatch, capsys, "run", f"--poll={poll}", "launcher=slurm_local",
                           "cluster=local_slurm", f"results_dir={tmp_path}/r")
    assert code == 2 and err.startswith(f"harness run: --poll='{poll}'") and not (tmp_path / "r").exists()


def test_nvme_offload_is_refused_before_launch_where_async_io_cannot_load(tmp_path, monkeypatch, capsys, no_process):
    import harness.launch.prepare as prepare

    monkeypatch.setattr(prepare, "op_compatible", lambda builder: ("async_io", False))
    code, out, err = harness(monkeypatch, capsys, "run", "recipes=cpu_zero3", "layout.offload_optimizer=nvme",
                             f"layout.nvme_path={tmp_path}/swap", f"results_dir={tmp_path}/r")
    assert code == 2  # refused before Hydra makes the run's folder: nothing written
    assert "layout.offload_optimizer=nvme needs DeepSpeed's async_io op, which cannot load on this machine" in err
    assert not (tmp_path / "r").exists()


def test_the_nvme_check_and_doctor_ask_deepspeed_the_same_question(monkeypatch):
    import harness.engines.deepspeed_ops as ops
    from harness.doctor import deepspeed_facts
    from harness.launch.prepare import nvme_problem
    from harness.config.compose import compose_run_config

    name, ok = ops.op_compatible(ops.ASYNC_IO)
    fact = next(f for f in deepspeed_facts() if f.name == f"deepspeed op {name}")
    cfg = compose_run_config(["recipes=cpu_zero3", "layout.offload_params=nvme", "layout.nvme_path=/tmp/x"])
    assert (fact.status == WARN) == (not ok) == (nvme_problem(cfg) is not None)


@pytest.mark.parametrize("line, instead", [
    ("--nodes=8", "cluster.nodes"), ("-N 8", "cluster.nodes"), ("-N8", "cluster.nodes"),
    ("--nodes 8", "cluster.nodes"), ("--ntasks-per-node=16", "cluster.accelerators_per_node"),
    ("-n64", "cluster.nodes and cluster.accelerators_per_node"),
    ("--cpus-per-task=64", "cluster.accelerators_per_node"),
    ("-c 4", "cluster.accelerators_per_node"), ("--mincpus=99", "cluster.accelerators_per_node"),
    ("--time=99:00:00", "launcher.time_limit"), ("-t60", "launcher.time_limit"),
    ("--gres=gpu:8", "launcher.gpus_per_node_gres"), ("--gpus=8", "launcher.gpus_per_node_gres"),
    ("--nodelist=node[1-4]", "launcher.partition and launcher.constraint"), ("-w node1", "launcher.partition"),
    ("--partition=other", "launcher.partition"), ("-p other", "launcher.partition"),
    ("--account=a", "launcher.account"), ("--qos=high", "launcher.qos"), ("-C h100", "launcher.constraint"),
    ("--exclusive", "launcher.exclusive"), ("--nod=2", "cluster.nodes"),
])
def test_every_option_of_the_job_shape_is_refused_with_the_field_to_use(line, instead):
    problems = list(sbatch_option_problems([line]))
    assert len(problems) == 1 and problems[0][0] == "launcher.extra_sbatch[0]"
    assert f"which the harness writes from {instead}" in problems[0][2], problems


@pytest.mark.parametrize("line", ["--mem=0", "--reservation=bench", "--mail-type=END", "--exclude=node3",
                                  "--mem 250M", "--comment=nightly"])
def test_options_the_harness_does_not_set_stay_the_users(line):
    assert list(sbatch_option_problems([line])) == []


def test_a_user_config_dir_is_searched_by_the_precheck(tmp_path, monkeypatch, capsys):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "good.yaml").write_text((CONFIG_DIR.parent / "recipes" / "cpu_zero2.yaml").read_text()
                                                    .replace("sweep_name: cpu_zero2", "sweep_name: good"))
    code, out, err = harness(monkeypatch, capsys, "plan", "--config-dir", str(tmp_path), "recipes=good", "--json")
    assert code == 0, err
    code, out, err = harness(monkeypatch, capsys, "run", "--config-dir", str(tmp_path), "recipes=good", "--cfg", "job")
    assert code == 0 and "sweep_name: good" in out, err


def test_a_broken_yaml_on_the_search_path_names_its_file_and_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "layout").mkdir()
    (tmp_path / "layout" / "broken.yaml").write_text("name: broken\ntp: [1, 2\nzero_stage: 1\n")
    code, _, err = harness(monkeypatch, capsys, "run", f"hydra.searchpath=[file://{tmp_path}]", "layout=broken",
                           f"results_dir={tmp_path}/r")
    assert code == 2
    assert err.strip().startswith(f"harness run: {tmp_path}/layout/broken.yaml:3:11: not valid YAML: expected ','")


def test_doctor_refuses_an_unknown_option_and_help_runs_no_check(monkeypatch, capsys):
    import harness.doctor as doctor

    monkeypatch.setattr(doctor, "gather", lambda *a: pytest.fail("the doctor ran"))
    code, _, err = harness(monkeypatch, capsys, "doctor", "--bogus")
    assert code == 2 and err.strip().startswith("harness doctor: unrecognized arguments: --bogus")
    code, out, _ = harness(monkeypatch, capsys, "doctor", "--help")
    assert code == 0 and out.startswith("usage: harness doctor")


def test_a_wandb_mode_wandb_would_refuse_is_a_warning():
    mode = wandb_facts({"WANDB_MODE": "garbage"})[0]
    assert mode.status == WARN and "WANDB_MODE='garbage' is not one of online, offline" in mode.detail
    assert wandb_facts({"WANDB_MODE": "disabled"})[0].status != WARN


def test_an_unknown_command_is_named(monkeypatch, capsys):
    code, out, err = harness(monkeypatch, capsys, "frobnicate")
    assert code == 2 and out == ""
    assert err.strip().startswith("harness: unknown command 'frobnicate': one of run, plan, sweep")


def test_plan_prints_the_composed_config_with_cfg_job(monkeypatch, capsys):
    code, out, err = harness(monkeypatch, capsys, "plan", "--cfg", "job", "layout.zero_stage=3")
    assert code == 0 and "zero_stage: 3" in out and "hydra:" not in out, err


def test_shell_completion_installs_for_harness_and_completes_after_the_command(monkeypatch, capsys):
    code, out, err = harness(monkeypatch, capsys, "run", "--shell-completion", "install=bash")
    assert code == 0 and out.rstrip().endswith("-F hydra_bash_completion harness"), err
    # what the installed script asks while `harness run layout.zero_st<TAB>` is typed
    monkeypatch.setenv("COMP_LINE", "harness run layout.zero_st")
    code, out, err = harness(monkeypatch, capsys, "-sc", "query=bash")
    assert code == 0 and out.split() == ["layout.zero_stage="], err


def test_plan_exits_one_when_any_layout_is_refused(monkeypatch, capsys):
    code, out, _ = harness(monkeypatch, capsys, "plan", "layout.tp=1,2,4", "--json")
    assert code == 1 and '"fit": "fits"' in out and out.count('"fit": "invalid"') == 2


def test_every_command_has_help_that_describes_its_options(monkeypatch, capsys):
    code, out, _ = harness(monkeypatch, capsys, "recommend", "--help")
    assert code == 0
    top, name = (out.split(f"\n  {flag}", 1)[1].split("\n  -", 1)[0] for flag in ("--top K", "--name NAME"))
    assert "best choices" in top and "sweep/NAME.yaml" in name and "user config" in name
    for command in ("calibrate", "sync", "doctor", "run", "plan", "sweep", "report"):
        code, out, _ = harness(monkeypatch, capsys, command, "--help")
        assert code == 0 and out.startswith("usage") and f"harness {command}" in out


def test_report_into_a_folder_it_cannot_write_is_one_line(tmp_path, monkeypatch, capsys):
    import pandas as pd

    import harness.report.build as build

    (tmp_path / "sweep").mkdir()
    (tmp_path / "afile").write_text("")
    monkeypatch.setattr(build, "summary_frame", lambda roots: pd.DataFrame([{"run": "000-x"}]))
    out_dir = tmp_path / "afile" / "r"
    code, _, err = harness(monkeypatch, capsys, "report", str(tmp_path / "sweep"), "--out", str(out_dir))
    assert code == 2 and err.strip() == (f"harness report: the report folder {tmp_path / 'afile' / 'r'} lies under "
                                         f"{tmp_path / 'afile'}, which is a file")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["afile", "sweep"]


def test_run_help_lists_every_config_group_and_its_options(monkeypatch, capsys, tmp_path):
    """`harness run --help` names the groups Hydra composes from and their options, the user's own too."""
    user = tmp_path / "config"
    (user / "sweep").mkdir(parents=True)
    (user / "sweep" / "mine.yaml").write_text("# @package _global_\n")
    monkeypatch.setenv("HARNESS_CONFIG_DIR", str(user))
    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = harness(monkeypatch, capsys, "run", "--help")
    groups = {line.split(":")[0].strip(): line.split(":", 1)[1] for line in out.splitlines()
              if line.startswith("    ") and ":" in line}
    assert code == 0 and {"model", "engine", "layout", "cluster", "data", "tracking", "launcher", "recipes",
                          "sweep"} <= set(groups)
    assert "nd_tp2" in groups["layout"] and "cpu_zero2" in groups["recipes"] and "mine" in groups["sweep"]


def test_the_op_check_answers_as_deepspeed_itself_does():
    """The harness's quiet check must give DeepSpeed's own answer: its probe compiles with output sent to
    sys.stderr's file descriptor, which a Python-level redirect (a StringIO) does not have."""
    import harness.engines.deepspeed_ops as ops
    from deepspeed.ops import op_builder

    for builder in ops.DEEPSPEED_OPS:
        ops.op_compatible.cache_clear()
        assert ops.op_compatible(builder)[1] == bool(getattr(op_builder, builder)().is_compatible(verbose=False))


def test_a_run_bound_for_an_unreachable_slurm_writes_nothing(tmp_path, monkeypatch, capsys, no_process):
    """A GPU recipe's stand-in goes by its recipe's Slurm launcher: with Slurm down it wrote a FAILED run folder
    and a report before saying so. It now asks Slurm first."""
    import harness.launch.slurm_commands as slurm

    monkeypatch.setattr(slurm, "check_reachable", lambda timeout=30: "Slurm is not reachable: sinfo failed")
    code, out, err = harness(monkeypatch, capsys, "run", "recipes=gpu_llama8b_fsdp_8gpu", "standin=cpu",
                             f"results_dir={tmp_path}/r")
    assert code == 2 and not (tmp_path / "r").exists()
    assert err.strip() == "harness run: Slurm is not reachable: sinfo failed; or run here with launcher=local"
