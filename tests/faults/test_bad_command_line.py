"""Generated bad input: every command x every kind of argument (flag, option value, override, path, name,
sbatch option) with malformed values. Each case must end in one line on stderr naming what is wrong, a
non-zero exit, no traceback, no process started (nothing submitted to Slurm, no rank launched) and
nothing written: not in the working folder, not in hydra_configs/, not in the profile cache.

The cases run through `harness.cli.main` in this process; the last tests run a few through the installed
entry point to show the same from a shell. The case id starts with its category, so
`pytest tests/faults/test_bad_command_line.py -v | grep -c 'paths-.*PASSED'` counts one category.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from harness import REPO_ROOT, cli
from harness.config.checks import OWNED_SBATCH
from harness.config.compose import CONFIG_DIR
from harness.plan import hardware

Case = Tuple[str, List[str]]  # (id, arguments after `harness`); {tmp} is the case's working folder
CASES: List[Case] = []


def add(category: str, what: str, args: List[str]) -> None:
    CASES.append((f"{category}-{what}", args))


RESULTS = "results_dir={tmp}/results"
# The commands that take Hydra overrides, each with what it needs besides them.
OVERRIDE_COMMANDS = {
    "run": ["run", RESULTS],
    "plan": ["plan"],
    "sweep": ["sweep", "--dry-run", RESULTS],
    "recommend": ["recommend", "--global-batch", "8"],
    "tune": ["tune", "--global-batch", "8", RESULTS],
}
# Every command line the harness has, with valid arguments up to the one the case breaks.
ALL_COMMANDS = {
    **OVERRIDE_COMMANDS,
    "sweep-status": ["sweep", "status", "{tmp}/sweep"],
    "sweep-resume": ["sweep", "resume", "{tmp}/sweep", "--dry-run"],
    "sweep-cancel": ["sweep", "cancel", "{tmp}/sweep"],
    "report": ["report", "{tmp}/sweep"],
    "calibrate": ["calibrate"],
    "calibrate-slurm": ["calibrate", "--slurm"],
    "doctor": ["doctor"],
}

# ---------------------------------------------------------------- unknown commands and flags
for word in ("frobnicate", "runn", "Run", "--frob", "-x", "plan2"):
    add("command", f"unknown-{word}", [word])
for name, base in ALL_COMMANDS.items():
    for flag in ("--frob", "--bogus-flag", "-Z", "--no-such=1", "---"):
        add("flag", f"{name}{flag}", [*base, flag])
for name in ("sync-no-folder", "sync-only-options"):
    add("flag", name, ["sync"] if name == "sync-no-folder" else ["sync", "--dry-run"])

# ---------------------------------------------------------------- option values
BAD_SECONDS = ("abc", "-1", "nan", "inf", "0", "", "-5", "1e999")
for value in BAD_SECONDS:
    add("option", f"run--poll={value}", ["run", f"--poll={value}", RESULTS, "launcher=slurm_local",
                                         "cluster=local_slurm"])
    add("option", f"sweep--poll={value}", ["sweep", f"--poll={value}", RESULTS, "launcher=slurm_local"])
    add("option", f"sweep-status--poll={value}", ["sweep", "status", "{tmp}/sweep", f"--poll={value}"])
BAD_COUNTS = ("abc", "0", "-3", "1.5", "")
for value in BAD_COUNTS:
    add("option", f"recommend--top={value}", ["recommend", "--global-batch", "8", "--top", value])
    add("option", f"recommend--global-batch={value}", ["recommend", "--global-batch", value])
    add("option", f"tune--top={value}", ["tune", "--global-batch", "8", "--top", value])
    add("option", f"tune--global-batch={value}", ["tune", "--global-batch", value])
    add("option", f"calibrate--ranks={value}", ["calibrate", "--ranks", value])
    add("option", f"calibrate-slurm--nodes={value}", ["calibrate", "--slurm", "--nodes", value])
    add("option", f"calibrate-slurm--tasks-per-node={value}", ["calibrate", "--slurm", "--tasks-per-node", value])
add("option", "recommend-without--global-batch", ["recommend"])
add("option", "tune-without--global-batch", ["tune"])
for value in ("nd,nd", "nd,", ",fsdp", "nd,megatron2"):  # tune's several-engine list
    add("option", f"tune-engine={value}", [*OVERRIDE_COMMANDS["tune"], f"engine={value}"])
for value in ("fp7", "", "BF16"):
    add("option", f"calibrate--precision={value}", ["calibrate", "--precision", value])
    add("option", f"calibrate-slurm--precision={value}", ["calibrate", "--slurm", "--precision", value])
for command in ("run", "plan"):
    for flags in (["--cfg", "bogus"], ["--cfg"], ["-c", "yaml"], ["--config-dir"], ["--config-dir", "{tmp}/afile"]):
        add("option", f"{command}{'='.join(flags)}", [*OVERRIDE_COMMANDS[command], *flags])
add("option", "run--info=bogus", ["run", "--info", "bogus"])
add("option", "run-m-and--cfg", ["run", "-m", "--cfg", "job", "layout.zero_stage=1,2"])
add("option", "report--out-without-folder", ["report", "{tmp}/sweep", "--out"])

# ---------------------------------------------------------------- overrides
BAD_OVERRIDES = (
    "layout.tp=two", "layout.tp=2.5", "layout.tp=0", "layout.zero_stage=4", "layout.zero_stagee=1",
    "layout.precision=fp7", "layout.seq_len=abc", "layout.seq_len=0", "layout.micro_batch=-3",
    "layout.pp_stage_layers=[1,2", "model=nonexistent", "engine=megatron2", "cluster=nosuch",
    "recipes=not_a_recipe", "launcher=nosuch", "bench.lr=nan", "bench.steps=0", "cluster.nodes=0",
    "tracking.mode=foo", "data.kind=foo", "model.hub_id='bad id'", "=value", "layout.tp=null", "standin=gpu",
    "layout.offload_optimizer=disk", "cluster.host_memory_gib=-1",
)
for name, base in OVERRIDE_COMMANDS.items():
    for override in BAD_OVERRIDES:
        add("override", f"{name}-{override}", [*base, override])

# ---------------------------------------------------------------- paths
for where, value in (("a-file", "{tmp}/afile"), ("under-a-file", "{tmp}/afile/sub"),
                     ("read-only", "/proc/sys/harness-results")):
    add("paths", f"run-results_dir-{where}", ["run", f"results_dir={value}"])
    add("paths", f"run-m-results_dir-{where}", ["run", "-m", f"results_dir={value}", "layout.zero_stage=1,2"])
    add("paths", f"sweep-results_dir-{where}", ["sweep", "--dry-run", f"results_dir={value}"])
for where, value in (("missing", "{tmp}/missing"), ("a-file", "{tmp}/afile"), ("empty", "{tmp}/empty"),
                     ("not-results", "{tmp}/notresults")):
    add("paths", f"report-{where}", ["report", value])
    add("paths", f"sync-{where}", ["sync", value])
    for sub in ("status", "resume", "cancel"):
        add("paths", f"sweep-{sub}-{where}", ["sweep", sub, value])
add("paths", "report-one-good-one-missing", ["report", "{tmp}/empty", "{tmp}/missing"])
for where, value in (("under-a-file", "{tmp}/afile/p.json"), ("a-folder", "{tmp}/empty"),
                     ("read-only", "/proc/sys/harness/p.json")):
    add("paths", f"calibrate--out-{where}", ["calibrate", "--out", value])
    add("paths", f"calibrate-slurm--out-{where}", ["calibrate", "--slurm", "--out", value])
for command in ("run", "plan"):
    add("paths", f"{command}-data.path-missing", [*OVERRIDE_COMMANDS[command], "data=text",
                                                   "data.path={tmp}/missing.txt"])
    add("paths", f"{command}-data.path-a-folder", [*OVERRIDE_COMMANDS[command], "data=text", "data.path={tmp}/empty"])
    add("paths", f"{command}--config-dir-missing", [*OVERRIDE_COMMANDS[command], "--config-dir", "{tmp}/missing",
                                                     "recipes=good"])
    add("paths", f"{command}-searchpath-missing", [*OVERRIDE_COMMANDS[command],
                                                    "hydra.searchpath=[file://{tmp}/missing]", "layout=broken"])
    add("paths", f"{command}-searchpath-broken-yaml", [*OVERRIDE_COMMANDS[command],
                                                        "hydra.searchpath=[file://{tmp}/broken]", "layout=broken"])

# ---------------------------------------------------------------- names that become paths
BAD_NAMES = ("../../x", "a/b", ".hidden", "-x", "a b", "x;rm", "", "/abs")
for value in BAD_NAMES:
    add("names", f"recommend--name={value}", ["recommend", "--global-batch", "8", "--name", value])
    add("names", f"calibrate--name={value}", ["calibrate", "--name", value])
    add("names", f"calibrate-slurm--name={value}", ["calibrate", "--slurm", "--name", value])
NAME_FIELDS = ("sweep_name", "layout.name", "model.name", "cluster.name")
for value in ("../../x", "a/b", ".hidden", "-x", "'a b'", "''"):
    for field in NAME_FIELDS:
        add("names", f"run-{field}={value}", ["run", RESULTS, f"{field}={value}"])
    add("names", f"sweep-sweep_name={value}", ["sweep", "--dry-run", RESULTS, f"sweep_name={value}"])
    add("names", f"plan-layout.name={value}", ["plan", f"layout.name={value}"])


# ---------------------------------------------------------------- sbatch options the harness owns
def _spellings(option: str, short: str) -> List[Tuple[str, str]]:
    flag_only = option in ("--exclusive", "--requeue")
    out = [("long", option)] if flag_only else [("long=", f"{option}=8"), ("long-apart", f"{option} 8")]
    if short:
        out += [("short-attached", f"{short}8"), ("short-apart", f"{short} 8")]
    prefix = option[:-2]
    if not flag_only and len(prefix) > 3 and not any(o.startswith(prefix) for o in OWNED_SBATCH if o != option):
        out.append(("prefix", f"{prefix}=8"))
    return out


SBATCH_COMMANDS = ("plan", "run", "sweep")
for index, (option, (short, _)) in enumerate(OWNED_SBATCH.items()):
    for spelling, line in _spellings(option, short or ""):
        command = SBATCH_COMMANDS[(index + len(spelling)) % len(SBATCH_COMMANDS)]
        add("extra_sbatch", f"{command}{option}-{spelling}",
            [*OVERRIDE_COMMANDS[command], "launcher=slurm_local", f"launcher.extra_sbatch=['{line}']"])
for first, second in (("-N", "8"), ("--nodes", "8"), ("-t", "99:00:00")):
    add("extra_sbatch", f"run-{first}-then-{second}", ["run", RESULTS, "launcher=slurm_local",
                                                       f"launcher.extra_sbatch=['{first}','{second}']"])
for line in ("--nodes=8", "-N 8", "-N8", "--ntasks-per-node=16", "-n64", "--cpus-per-task=64", "--mincpus=99",
             "--time=99:00:00", "--gres=gpu:8", "--nodelist=node1", "--partition=other"):
    add("extra_sbatch", f"calibrate-slurm-{line}", ["calibrate", "--slurm", f"--sbatch={line}"]
        if not line.startswith(("--cpus", "--min", "--time", "--gres", "--nodelist", "--partition")) else
        ["run", RESULTS, "launcher=slurm_local", "cluster=local_slurm", f"launcher.extra_sbatch=['{line}']"])


def _tree(folder: Path) -> List[Tuple[str, int]]:
    if not folder.exists():
        return []
    return sorted((str(p.relative_to(folder)), p.stat().st_mtime_ns) for p in folder.rglob("*"))


@pytest.fixture
def workdir(tmp_path, tmp_path_factory, monkeypatch) -> Path:
    """The case's working folder: a file, an empty folder, a folder without runs, a sweep folder without runs,
    a broken YAML preset; the profile cache as a private copy (the Slurm tests, running beside these, write
    profiles in the shared one); and every way to start a process refused."""
    profiles = tmp_path_factory.mktemp("profiles")
    for cached in hardware.PROFILE_DIR.glob("*.json"):  # a profile another test removes meanwhile is skipped
        try:
            shutil.copy2(cached, profiles / cached.name)
        except FileNotFoundError:
            pass
    monkeypatch.setattr(hardware, "PROFILE_DIR", profiles)
    (tmp_path / "afile").write_text("not a folder\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notresults").mkdir()
    (tmp_path / "notresults" / "notes.txt").write_text("no runs here\n")
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.json").write_text('{"sweep_name": "s", "launcher": "local", "points": []}\n')
    (tmp_path / "broken" / "layout").mkdir(parents=True)
    (tmp_path / "broken" / "layout" / "broken.yaml").write_text("name: broken\ntp: [1, 2\nzero_stage: 1\n")
    monkeypatch.chdir(tmp_path)
    started = []

    class NoProcess:
        def __init__(self, args, *rest, **kwargs):
            started.append(args)
            raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", NoProcess)
    monkeypatch.setattr(cli, "_run_options", {"wait": True, "poll_s": None})
    yield tmp_path
    assert started == []


@pytest.mark.parametrize("case, args", CASES, ids=[case for case, _ in CASES])
def test_bad_command_line_is_one_line_and_changes_nothing(case, args, workdir, monkeypatch, capsys):
    argv = [arg.replace("{tmp}", str(workdir)) for arg in args]
    before = _tree(workdir), _tree(CONFIG_DIR), _tree(hardware.PROFILE_DIR)
    monkeypatch.setattr(sys, "argv", ["harness", *argv])
    try:
        code = cli.main()
    except SystemExit as exit_info:  # only argparse's --help may exit; a bad argument must return
        code = f"SystemExit({exit_info.code})"
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert code in (1, 2), f"{case}: exit {code}\n{out.out[-1500:]}\n{out.err[-1500:]}"
    assert "Traceback" not in out.out + out.err
    assert len(lines) == 1 and lines[0].startswith("harness"), out.err
    assert (_tree(workdir), _tree(CONFIG_DIR), _tree(hardware.PROFILE_DIR)) == before, "something was written"


def test_the_grid_covers_every_command_and_kind_with_at_least_250_cases():
    categories = {case.split("-", 1)[0] for case, _ in CASES}
    assert categories == {"command", "flag", "option", "override", "paths", "names", "extra_sbatch"}
    commands = {args[0] for _, args in CASES}
    assert set(cli.COMMANDS) <= commands
    assert len(CASES) >= 250 and len({case for case, _ in CASES}) == len(CASES)


@pytest.mark.parametrize("args, line", [
    (["frobnicate"], "harness: unknown command 'frobnicate'"),
    (["plan", "--bogus-flag"], "harness plan: unknown option --bogus-flag"),
    (["run", "--poll=abc", "launcher=slurm_local"], "harness run: --poll='abc' is not a number of seconds"),
    (["recommend", "--global-batch", "8", "--name", "../../../../../tmp/x"], "harness recommend: argument --name:"),
])
def test_the_installed_command_line_says_the_same_in_one_line(args, line, tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness.cli", *args, f"results_dir={tmp_path}/r"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "HYDRA_FULL_ERROR": "1"})
    assert out.returncode == 2 and out.stderr.startswith(line) and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert list(tmp_path.iterdir()) == []
