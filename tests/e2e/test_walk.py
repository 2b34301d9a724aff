"""A new user's walk through the README, as a script: the GPU planning example(s) copied from README.md, a
recommend and its printed next step on the local Slurm cluster, a small local sweep, a Slurm sweep with live
step lines, the report and a comparison of two sweeps. Every command runs at COLUMNS=100 (one at 80) and must
exit as expected, print no line wider than the terminal (stdout and stderr) and no Traceback.

The transcript of the walk is written to `walk.txt` in the test's folder (and to $HARNESS_WALK_TRANSCRIPT
when set). Tiny Llama, two warm-up steps and two timed steps per run: a few minutes on two cores."""

from __future__ import annotations

import csv
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
COLUMNS = 100
STEP_LINE = re.compile(r"\[step \d+/\d+\] loss ")
TINY = ["model=tiny_llama", "tracking=disabled", "bench.warmup_steps=2", "bench.warmup_max_steps=2",
        "bench.steps=2"]


VERDICT = re.compile(r"^ (\S.*?)\s{2,}(fits|OOM|invalid)\s")


def merged(before: list[str], after: list[str]) -> list[str]:
    """`before` with the overrides of `after` (a key given again takes the later value), flags dropped."""
    args = {arg.split("=", 1)[0]: arg for arg in before if not arg.startswith("-")}
    args.update({arg.split("=", 1)[0]: arg for arg in after})
    return list(args.values())


def readme_plan_examples(text: str) -> list[tuple[list[str], dict[str, str]]]:
    """The `harness plan model=llama3_1_70b cluster=h100_8x8 ...` commands of README.md as (argv, the layout rows
    README shows under it: label -> fits / OOM / invalid): each `$ ` line of a code block with its `\\`
    continuations (`harness plan ... X` there repeats the previous command's arguments, X overriding), and each
    one written inline in backticks (no rows shown)."""
    examples: list[tuple[list[str], dict[str, str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.startswith("$ harness plan "):
            continue
        command = line[2:]
        while command.endswith("\\"):
            command = command[:-1] + " " + lines[i].strip()
            i += 1
        argv = shlex.split(command)[2:]
        if argv[:1] == ["..."]:
            argv = merged(examples[-1][0], argv[1:])
        rows = {}
        while i < len(lines) and not lines[i].startswith(("$ ", "```")):
            shown = VERDICT.match(lines[i])
            if shown:
                rows[shown.group(1)] = shown.group(2)
            i += 1
        examples.append((argv, rows))
    inline = re.findall(r"`(harness plan model=llama3_1_70b\s+cluster=h100_8x8[^`]*)`", text)
    examples += [(shlex.split(" ".join(command.split()))[2:], {}) for command in inline]
    return examples


class Walk:
    """Runs each command as the user would type it, records it in the transcript, checks what it printed."""

    def __init__(self, env: dict, transcript: Path):
        self.env = env
        self.transcript = transcript
        transcript.write_text("")

    def __call__(self, argv: list[str], expect: int | set = 0, columns: int = COLUMNS, timeout: float = 900,
                 machine: bool = False) -> subprocess.CompletedProcess:
        """`machine`: CSV / JSON for a program, exempt from the width check (Traceback and exit still checked)."""
        env = {**self.env, "COLUMNS": str(columns)}
        proc = subprocess.run([sys.executable, "-m", "harness.cli", *argv], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
        shown = "harness " + shlex.join(argv)
        with self.transcript.open("a") as log:
            log.write(f"$ COLUMNS={columns} {shown}\n{proc.stdout}")
            log.write("".join(f"[stderr] {line}\n" for line in proc.stderr.splitlines()))
            log.write(f"[exit {proc.returncode}]\n\n")
        both = proc.stdout + proc.stderr
        expected = expect if isinstance(expect, set) else {expect}
        assert proc.returncode in expected, f"{shown} exited {proc.returncode}\n{both[-4000:]}"
        assert "Traceback" not in both, f"{shown} printed a traceback\n{both[-4000:]}"
        wide = [f"{len(line)}: {line}" for line in (proc.stderr if machine else both).splitlines()
                if len(line) > columns]
        assert not wide, f"{shown}: line(s) wider than COLUMNS={columns}:\n" + "\n".join(wide)
        return proc


@pytest.fixture
def walk(slurm_cluster, tmp_path) -> Walk:
    env = {**slurm_cluster, "HARNESS_CONFIG_DIR": str(tmp_path / "config")}
    return Walk(env, tmp_path / "walk.txt")


def sweep_dir(proc: subprocess.CompletedProcess) -> Path:
    """The sweep folder a finished sweep names in its `[harness] summary:` line."""
    summary = re.search(r"\[harness\] summary:\s*(\S+)summary\.csv", re.sub(r"\n\s+", "", proc.stdout))
    assert summary, proc.stdout[-3000:]
    return Path(summary.group(1))


def test_readme_walk(walk, tmp_path):
    results = tmp_path / "results"
    try:
        _walk(walk, results)
    finally:
        copy = os.environ.get("HARNESS_WALK_TRANSCRIPT")
        if copy:
            Path(copy).parent.mkdir(parents=True, exist_ok=True)
            Path(copy).write_text(walk.transcript.read_text())


def _walk(walk: Walk, results: Path) -> None:
    # 1. Planning on GPUs, the README's examples as written there (exit 1 where a layout is refused).
    examples = readme_plan_examples(README.read_text())
    assert len(examples) >= 3 and sum(bool(rows) for _, rows in examples) >= 2, examples
    # Exit 0 when every layout README shows fits, 1 when one is refused (either where it shows none).
    planned = [walk(["plan", *argv], expect=({0, 1} if not rows else int(set(rows.values()) != {"fits"})))
               for argv, rows in examples]
    planned.append(walk(["plan", *examples[-1][0]], expect={0, 1}, columns=80))
    for argv, rows in examples:  # the rows README shows are the rows the plan prints (label and verdict)
        if rows:
            table = csv.DictReader(io.StringIO(walk(["plan", *argv, "--csv"], expect={0, 1}, machine=True).stdout))
            assert {row["label"]: row["fit"] for row in table} == rows, (argv, rows)
    assert any("layout not given in full" in proc.stderr for proc in planned)  # the GPU-first defaults

    # 2. A recommendation, then the next step it prints, verbatim, on the local Slurm cluster.
    ranked = walk(["recommend", "--global-batch", "4", "--top", "1", "--name", "walk_rec", *TINY,
                   "engine=deepspeed", "cluster=local_slurm", "launcher=slurm_local", "layout.seq_len=64",
                   f"results_dir={results}"])
    printed = re.search(r"run them with: harness (sweep sweep=\S+)", ranked.stdout)
    assert printed, ranked.stdout
    recommended = walk([*shlex.split(printed.group(1)), "--poll=1"])
    assert STEP_LINE.search(recommended.stdout), recommended.stdout[-3000:]

    # 3. A small local sweep: two points, one after another.
    local = walk(["sweep", *TINY, "layout=single", "cluster.accelerators_per_node=1", "engine=deepspeed",
                  "layout.zero_stage=1,2", "sweep_name=walk_local", f"results_dir={results}"])
    assert STEP_LINE.search(local.stdout) and "2 done, 0 failed" in local.stdout, local.stdout[-3000:]

    # 4. The same grid as one Slurm job array, followed with live step lines.
    slurm = walk(["sweep", *TINY, "layout=single", "cluster.accelerators_per_node=1", "engine=deepspeed",
                  "layout.zero_stage=1,2", "cluster=local_slurm", "launcher=slurm_local", "--poll=1",
                  "sweep_name=walk_slurm", f"results_dir={results}"])
    assert len(STEP_LINE.findall(slurm.stdout)) >= 2, slurm.stdout[-3000:]

    # 5. The report of one sweep, then the two compared.
    local_dir, slurm_dir = sweep_dir(local), sweep_dir(slurm)
    walk(["report", str(local_dir)])
    assert (local_dir / "report.html").is_file()
    compared = walk(["report", str(local_dir), str(slurm_dir)])
    assert "compare" in compared.stdout, compared.stdout
